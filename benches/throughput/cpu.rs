//! Who used the CPU during a run (Linux `/proc`).

/// Machine-wide and own CPU time (Linux `/proc`, in clock ticks summed over all cores), to
/// tell whether a run was CPU-bound on this small machine and who used the CPU.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuSnap {
    pub(crate) total: u64,
    pub(crate) idle: u64,
    pub(crate) own: u64,
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
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        let after_comm = own.rsplit_once(')')?.1;
        let fields: Vec<&str> = after_comm.split_whitespace().collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some(CpuSnap {
            total: cpu.iter().sum(),
            idle: cpu[3] + cpu[4],
            own: utime + stime,
        })
    }

    /// (machine busy fraction, this process's fraction) of all cores since `self`.
    pub(crate) fn since(self, later: CpuSnap) -> Option<(f64, f64)> {
        let total = later.total.checked_sub(self.total)? as f64;
        if total <= 0.0 {
            return None;
        }
        let idle = later.idle.saturating_sub(self.idle) as f64;
        let own = later.own.saturating_sub(self.own) as f64;
        Some(((total - idle) / total, (own / total).min(1.0)))
    }
}

pub(crate) fn fmt_cpu(cpu: Option<(f64, f64)>) -> String {
    cpu.map(|(busy, own)| {
        format!(
            "  cpu {:.0}% busy (bench process {:.0}%, rest {:.0}%)",
            busy * 100.0,
            own * 100.0,
            (busy - own).max(0.0) * 100.0
        )
    })
    .unwrap_or_default()
}
