//! MySQL 8 / MariaDB 10.6+: schema and server capabilities.
//!
//! Timestamps are `DATETIME(6)` written with `NOW(6)`, i.e. in the session time zone: keep the
//! server's `time_zone` the same for the application and the relay (UTC recommended).
//! Sessions run at READ COMMITTED so that the claim's locking read takes no gap locks that
//! would block the application's inserts.

/// Schema version 1. MySQL has no `CREATE INDEX IF NOT EXISTS`, so indexes are inline.
pub(super) fn schema_v1(t: &str) -> Vec<String> {
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                channel VARCHAR(191) NOT NULL,
                recipient TEXT NULL,
                payload JSON NOT NULL,
                ordering_key VARCHAR(191) NULL,
                status VARCHAR(16) NOT NULL DEFAULT 'PENDING',
                attempts INT NOT NULL DEFAULT 0,
                next_attempt_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                claimed_by VARCHAR(255) NULL,
                claim_token VARCHAR(64) NULL,
                claimed_until DATETIME(6) NULL,
                last_error TEXT NULL,
                created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                sent_at DATETIME(6) NULL,
                KEY {t}_due_idx (status, next_attempt_at),
                KEY {t}_ordering_idx (ordering_key, id),
                KEY {t}_status_idx (status, updated_at),
                KEY {t}_age_idx (status, created_at),
                CONSTRAINT {t}_status_chk CHECK (status IN ('PENDING', 'RETRY', 'SUCCESS', 'FAILED'))
            ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        ),
        "CREATE TABLE IF NOT EXISTS outbox_relay_lease (
            name VARCHAR(191) NOT NULL PRIMARY KEY,
            holder VARCHAR(255) NULL,
            lease_until DATETIME(6) NULL,
            epoch BIGINT NOT NULL DEFAULT 0
        ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            .to_string(),
    ]
}

/// Whether a server (by `SELECT VERSION()`) is MariaDB, and whether it has
/// `FOR UPDATE SKIP LOCKED` (MariaDB 10.6+, MySQL 8.0.1+).
pub(super) fn capabilities(version: &str) -> (bool, bool) {
    let mariadb = version.to_ascii_lowercase().contains("mariadb");
    let mut nums = version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().unwrap_or(0));
    let major = nums.next().unwrap_or(0);
    let minor = nums.next().unwrap_or(0);
    let skip_locked = if mariadb {
        (major, minor) >= (10, 6)
    } else {
        major >= 8
    };
    (mariadb, skip_locked)
}

#[cfg(test)]
mod tests {
    use super::capabilities;

    #[test]
    fn detects_skip_locked_support() {
        assert_eq!(capabilities("10.11.19-MariaDB-0+deb12u1"), (true, true));
        assert_eq!(capabilities("10.5.2-MariaDB"), (true, false));
        assert_eq!(capabilities("8.0.36"), (false, true));
        assert_eq!(capabilities("5.7.44-log"), (false, false));
    }
}
