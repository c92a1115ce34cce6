//! Who used the CPU during a run (Linux `/proc`).

/// The commands of database server processes: PostgreSQL (a process per session, all named
/// `postgres`) and MySQL/MariaDB (one process).
const SERVERS: &[&str] = &["postgres", "mariadbd", "mysqld"];

/// Machine-wide, own and database-server CPU time (Linux `/proc`, in clock ticks summed over
/// all cores), to tell whether a run was CPU-bound on this small machine and who used the CPU.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuSnap {
    pub(crate) total: u64,
    pub(crate) idle: u64,
    pub(crate) own: u64,
    /// Every database server process's time, with the time of its children that ended
    /// (PostgreSQL's postmaster collects its sessions' when they exit).
    pub(crate) server: u64,
}

/// Shares of all cores' time between two snapshots.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuShares {
    /// Not idle.
    pub(crate) busy: f64,
    /// This process (the relay, and the receiver when it runs in process).
    pub(crate) own: f64,
    /// The database servers (none for SQLite, which runs in this process).
    pub(crate) server: f64,
}

impl CpuShares {
    /// Everything else busy: the Node receiver when used, other work on the machine.
    pub(crate) fn rest(&self) -> f64 {
        (self.busy - self.own - self.server).max(0.0)
    }
}

/// (utime + stime, cutime + cstime) of one `/proc/<pid>/stat` text.
fn ticks(stat: &str) -> Option<(u64, u64)> {
    let after_comm = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    Some((field(11)? + field(12)?, field(13)? + field(14)?))
}

/// The database servers' CPU ticks, children that ended included.
fn server_ticks() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| {
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            if !SERVERS.contains(&comm.trim()) {
                return None;
            }
            let (own, children) = ticks(&std::fs::read_to_string(e.path().join("stat")).ok()?)?;
            Some(own + children)
        })
        .sum()
}

impl CpuSnap {
    pub(crate) fn take() -> Option<CpuSnap> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        if cpu.len() < 5 {
            return None;
        }
        let (own, _) = ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
        Some(CpuSnap {
            total: cpu.iter().sum(),
            idle: cpu[3] + cpu[4],
            own,
            server: server_ticks(),
        })
    }

    /// Shares of all cores since `self`.
    pub(crate) fn since(self, later: CpuSnap) -> Option<CpuShares> {
        let total = later.total.checked_sub(self.total)? as f64;
        if total <= 0.0 {
            return None;
        }
        let share = |a: u64, b: u64| (b.saturating_sub(a) as f64 / total).min(1.0);
        Some(CpuShares {
            busy: (total - later.idle.saturating_sub(self.idle) as f64) / total,
            own: share(self.own, later.own),
            server: share(self.server, later.server),
        })
    }
}

pub(crate) fn fmt_cpu(cpu: Option<CpuShares>) -> String {
    cpu.map(|c| {
        format!(
            "  cpu {:.0}% busy (bench process {:.0}%, database server {:.0}%, rest {:.0}%)",
            c.busy * 100.0,
            c.own * 100.0,
            c.server * 100.0,
            c.rest() * 100.0
        )
    })
    .unwrap_or_default()
}
