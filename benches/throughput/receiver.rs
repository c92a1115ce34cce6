//! The loopback receiver the whole run sends to: in this process, or Node's http server in
//! its own process (`receiver.js`), started and warmed once.

use super::*;

/// `benches/throughput/receiver.js` under `node`, killed when dropped.
pub(crate) struct NodeReceiver(std::process::Child);

impl NodeReceiver {
    /// Starts the script and waits for the port it prints.
    fn start() -> anyhow::Result<(Receiver, NodeReceiver)> {
        use std::io::BufRead;
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/throughput/receiver.js"
        );
        let mut child = std::process::Command::new("node")
            .arg(script)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("spawn node (OUTBOX_RELAY_BENCH_RECEIVER=node needs Node.js on PATH)")?;
        let stdout = child.stdout.take().context("node's stdout")?;
        let guard = NodeReceiver(child);
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        let port: u16 = line
            .trim()
            .parse()
            .with_context(|| format!("node printed {line:?}, not a port"))?;
        Ok((
            Receiver::external(&format!("http://127.0.0.1:{port}"))?,
            guard,
        ))
    }
}

impl Drop for NodeReceiver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Requests sent to the in-process receiver before anything is measured.
const WARM_UP: usize = 20_000;

/// Starts the receiver the plan asks for, warmed (see [`ceiling::warm`]), and says what it is; `None`
/// when it cannot start.
pub(crate) async fn start_receiver(plan: &Plan) -> Option<(Receiver, Option<NodeReceiver>)> {
    let started_receiver = if plan.node {
        NodeReceiver::start().map(|(r, child)| (r, Some(child)))
    } else {
        Receiver::start().await.map(|r| (r, None))
    };
    let (receiver, node) = match started_receiver {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the loopback receiver: {e:#}");
            return None;
        }
    };
    let kind = if plan.node {
        "Node's http server, its own process"
    } else {
        "in this process"
    };
    println!(
        "outbox-relay throughput bench: receiver {} (204, no work; {kind}), started once for the whole run; ceiling: {}; {} worker threads; tracing and metrics recorder not installed",
        receiver.url,
        CeilingClient::get().label(),
        plan.cores
    );
    // Node compiles its request path as it goes, which makes the first database's ceiling
    // low unless Node is warmed first (docs/performance-log.md).
    let warm_up = if plan.node { NODE_WARM_UP } else { WARM_UP };
    ceiling::warm(&receiver, warm_up).await;
    if plan.node && (plan.section_on("claim") || plan.section_on("latency")) {
        println!(
            "note: the claim and latency sections need the in-process receiver; skipped with OUTBOX_RELAY_BENCH_RECEIVER=node"
        );
    }
    Some((receiver, node))
}
