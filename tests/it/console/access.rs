//! Who gets in: no token, a wrong one or a cross-site request is refused; the configuration
//! is checked and the token never shown.

use super::*;

async fn refuses_without_the_token_and_cross_site(db: Db) {
    let Some(td) = TestDb::open(db, "console_auth").await else {
        return;
    };
    let rx = Receiver::start(None).await;
    let rows = seed(&td).await;
    let (_relay, base) = start_relay(&td, &rx, |c| c).await;
    let mut c = ConsoleClient::new(&base);
    let row = rows.boom[0];
    let requeue = format!("/row/{row}/requeue");

    // No token: a browser is sent to the login page, anything else gets 401.
    let a = c.get("/failed").await;
    assert_eq!(a.status, 303, "{a:?}");
    assert!(
        a.location
            .as_deref()
            .is_some_and(|l| l.starts_with("/login")),
        "{a:?}"
    );
    for path in [
        "/",
        "/failed",
        &format!("/row/{row}"),
        "/live.json",
        "/requeue",
        "/purge",
    ] {
        let a = c.send("GET", path, None, &[]).await;
        assert_eq!(a.status, 401, "GET {path} without the token");
        assert!(
            !a.body.contains("boom"),
            "GET {path} without the token showed rows"
        );
    }
    let a = c.post(&requeue, &[]).await;
    assert_eq!(a.status, 401, "{a:?}");
    let wrong = c
        .send(
            "GET",
            "/",
            None,
            &[("authorization", "Bearer not-the-token-at-all")],
        )
        .await;
    assert_eq!(wrong.status, 401);
    // Actions are POST only.
    let bearer = format!("Bearer {TOKEN}");
    let a = c
        .send("GET", &requeue, None, &[("authorization", &bearer)])
        .await;
    assert_eq!(a.status, 405);

    // Cross-site POSTs are refused even with the token.
    for headers in [
        vec![
            ("origin", "http://evil.example"),
            ("authorization", bearer.as_str()),
        ],
        vec![
            ("sec-fetch-site", "cross-site"),
            ("authorization", bearer.as_str()),
        ],
        vec![("origin", "null"), ("authorization", bearer.as_str())],
    ] {
        let a = c.send("POST", &requeue, Some(""), &headers).await;
        assert_eq!(a.status, 403, "{headers:?}: {a:?}");
    }
    assert_eq!(status_of(&td, row).await, "FAILED");

    // Login: a wrong token is refused; the right one sets a cookie that is not the token.
    let a = c.login("wrong-token-wrong-token", "mallory").await;
    assert_eq!(a.status, 401);
    let a = c.login(TOKEN, "alice").await;
    assert_eq!(a.status, 303, "{a:?}");
    let cookie = a.set_cookie.expect("a session cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(!cookie.contains(TOKEN), "{cookie}");
    assert_eq!(c.get("/").await.status, 200);
    // A session's POST needs the form's CSRF token.
    let a = c.post(&requeue, &[]).await;
    assert_eq!(a.status, 403, "{a:?}");
    let a = c.post(&requeue, &[("csrf", "0000")]).await;
    assert_eq!(a.status, 403, "{a:?}");
    assert_eq!(status_of(&td, row).await, "FAILED");
    // The login page never shows the token, nor does any page.
    assert!(!c.get("/").await.body.contains(TOKEN));
    td.drop_table().await;
}
per_db!(refuses_without_the_token_and_cross_site);

#[tokio::test]
async fn configuration_is_checked_and_the_token_never_shown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let check = |env: Vec<(&'static str, String)>| {
        let mut cmd = relay_command(dir.path());
        cmd.arg("check-config").envs(env);
        output_within("check-config", &mut cmd, Duration::from_secs(30))
    };
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    // Off by default.
    let o = check(vec![]);
    assert!(text(&o).contains("console: off"), "{}", text(&o));
    // On through the environment; the token is masked.
    let o = check(vec![("OUTBOX_RELAY__CONSOLE__TOKEN", TOKEN.into())]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("console: listen=127.0.0.1:9091 token=***"),
        "{}",
        text(&o)
    );
    assert!(!text(&o).contains(TOKEN));
    // Refusals name the key.
    for (env, key) in [
        (
            vec![("OUTBOX_RELAY__CONSOLE__TOKEN", "short".to_string())],
            "console.token",
        ),
        (
            vec![("OUTBOX_RELAY__CONSOLE__ENABLED", "true".to_string())],
            "console.token",
        ),
        (
            vec![
                ("OUTBOX_RELAY__CONSOLE__TOKEN", TOKEN.to_string()),
                ("OUTBOX_RELAY__CONSOLE__LISTEN", "nowhere".to_string()),
            ],
            "console.listen",
        ),
        (
            vec![
                ("OUTBOX_RELAY__CONSOLE__TOKEN", TOKEN.to_string()),
                (
                    "OUTBOX_RELAY__CONSOLE__LISTEN",
                    "127.0.0.1:9090".to_string(),
                ),
            ],
            "console.listen",
        ),
        (
            vec![(
                "OUTBOX_RELAY__CONSOLE__TOKEN_FILE",
                "/nonexistent/token".to_string(),
            )],
            "console.token_file",
        ),
    ] {
        let o = check(env.clone());
        assert_eq!(o.status.code(), Some(2), "{env:?}: {}", text(&o));
        assert!(
            text(&o).contains(key),
            "{env:?} should name {key}: {}",
            text(&o)
        );
        assert!(!text(&o).contains(TOKEN));
    }
    // A token file (a mounted Secret), trailing newline ignored; `enabled = false` turns it off.
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).expect("write token");
    let o = check(vec![(
        "OUTBOX_RELAY__CONSOLE__TOKEN_FILE",
        file.display().to_string(),
    )]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("console: listen="));
    let o = check(vec![
        (
            "OUTBOX_RELAY__CONSOLE__TOKEN_FILE",
            file.display().to_string(),
        ),
        ("OUTBOX_RELAY__CONSOLE__ENABLED", "false".into()),
    ]);
    assert!(text(&o).contains("console: off"), "{}", text(&o));
}
