//! One line of ftrace's text output, parsed: the events attribution needs, from the kernel's own
//! formats (`print fmt:` of each event's `format` file on 6.18; the recorded lines are in
//! `emulator/tests/fixtures/`).
//!
//! A line reads `<comm>-<pid> [<cpu>] <flags> <timestamp>: <event>: <fields>`. The command name
//! may hold spaces and dashes (`opt cbdr90np7zc-2571`), so the line is cut at the first
//! `[ddd] ` and the pid is what follows the last dash before it. The timestamp is the raw
//! counter under a counter clock (`x86-tsc`: `4914990751983`) or seconds with a fraction
//! under the others (`mono`: `4915.001579`), read here as nanoseconds.
//!
//! With the instance's `record-tgid` option the task column also carries the process id:
//! `qpw/1-4242 (   4200) [001] ...`, which tells our own worker threads from another
//! process's of the same name.
//!
//! `trace_pipe` also writes `CPU:<n> [LOST <count> EVENTS]` when the ring buffer overwrote
//! events the reader had not taken yet; that is a [`Kind::Lost`] event, never dropped.

/// One trace event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The CPU it happened on.
    pub cpu: usize,
    /// When, in trace-clock units (TSC ticks, or nanoseconds).
    pub ts: u64,
    /// The task that was current (`<idle>` is pid 0).
    pub pid: i32,
    /// Its command name.
    pub comm: String,
    /// Its process (thread group), when the trace records it (`options/record-tgid`).
    pub tgid: Option<i32>,
    /// What happened.
    pub kind: Kind,
}

/// The events attribution uses; the others are [`Kind::Other`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `sched:sched_switch`: the CPU passes from one task to another.
    Switch {
        /// The task leaving the CPU.
        prev_pid: i32,
        /// Its command name.
        prev_comm: String,
        /// The task taking the CPU.
        next_pid: i32,
        /// Its command name.
        next_comm: String,
    },
    /// `workqueue:workqueue_execute_start`: a kworker starts a work item.
    WorkStart {
        /// The work function (`lru_add_drain_per_cpu`).
        function: String,
    },
    /// `workqueue:workqueue_execute_end`.
    WorkEnd {
        /// The work function.
        function: String,
    },
    /// The start of an interrupt context: a device IRQ handler (`irq_handler_entry`), a softirq
    /// (`softirq_entry`), an x86 vector (`local_timer_entry`, `reschedule_entry`,
    /// `call_function_single_entry`, ...) or a cross-CPU call's function
    /// (`csd_function_entry`).
    Enter(Context),
    /// The matching end.
    Exit(Context),
    /// `timer:hrtimer_expire_entry`: a high-resolution timer fired on this CPU (the tick is
    /// one: `tick_nohz_handler` since 6.10, `tick_sched_timer` before).
    TimerExpire {
        /// The timer's function (`tick_nohz_handler`, `hrtimer_wakeup`).
        function: String,
    },
    /// `timer:tick_stop`: a `nohz_full` CPU tried to stop its tick; when it could not, the
    /// dependency that kept it (`SCHED`: another runnable task, `POSIX_TIMER`,
    /// `PERF_EVENTS`, `CLOCK_UNSTABLE`, `RCU`, `RCU_EXP`).
    TickStop {
        /// Whether the tick stopped.
        success: bool,
        /// What kept it, `NONE` when it stopped.
        dependency: String,
    },
    /// `kmem:mm_page_pcpu_drain`: a page leaves a pcp list for the zone's free lists, in
    /// `free_pcppages_bulk()`: a drain of some CPU's lists (`drain_pages_zone()`, run by the
    /// CPU that calls `drain_all_pages()` since 6.0), or a CPU trimming its own lists past
    /// `high`. The event does not say whose lists: the CPU it fired on is the one that freed.
    PcpDrain {
        /// The page's frame number.
        pfn: u64,
    },
    /// `workqueue:workqueue_queue_work`: a work item queued, to CPU `cpu` (-1: unbound).
    WorkQueued {
        /// The work function.
        function: String,
        /// The CPU it was queued to.
        cpu: i64,
    },
    /// Events the ring buffer lost on this CPU before they were read.
    Lost {
        /// How many.
        count: u64,
    },
    /// An event attribution does not use.
    Other {
        /// Its name.
        name: String,
    },
}

/// An interrupt-like context that nests on top of the running task.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Context {
    /// A device interrupt handler, by name (`virtio1-req.0`).
    Irq(String),
    /// A softirq, by action (`TIMER`, `RCU`, `NET_RX`).
    Softirq(String),
    /// An x86 system vector, by event name without `_entry` (`local_timer`, `reschedule`,
    /// `call_function_single`, `irq_work`).
    Vector(String),
    /// A cross-CPU function call run on this CPU (`csd_function_entry func=...`).
    CrossCall(String),
}

impl Context {
    /// The class it is counted in.
    pub fn class(&self) -> &'static str {
        match self {
            Context::Irq(_) => "irq",
            Context::Softirq(_) => "softirq",
            Context::Vector(v) if is_ipi_vector(v) => "ipi",
            Context::Vector(_) => "irq",
            Context::CrossCall(_) => "ipi",
        }
    }

    /// Its name for the report.
    pub fn label(&self) -> String {
        match self {
            Context::Irq(n) => format!("irq {n}"),
            Context::Softirq(n) => format!("softirq {n}"),
            Context::Vector(n) => format!("vector {n}"),
            Context::CrossCall(f) => format!("cross-CPU call {f}"),
        }
    }
}

/// The `irq_vectors` events (x86) that enter and leave an interrupt context.
pub const X86_VECTORS: [&str; 10] = [
    "local_timer",
    "reschedule",
    "call_function",
    "call_function_single",
    "irq_work",
    "x86_platform_ipi",
    "thermal_apic",
    "error_apic",
    "spurious_apic",
    "deferred_error_apic",
];

/// x86 vectors that another CPU sends (IPIs), as opposed to local interrupts.
fn is_ipi_vector(name: &str) -> bool {
    matches!(
        name,
        "reschedule" | "call_function" | "call_function_single" | "x86_platform_ipi"
    )
}

/// Why a line is not an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A header or blank line (`# tracer: nop`).
    #[error("not an event line")]
    NotEvent,
    /// A line that looks like an event but does not parse.
    #[error("cannot parse trace line `{line}`: {why}")]
    Malformed {
        /// The line.
        line: String,
        /// What was wrong.
        why: &'static str,
    },
}

/// Parses one line of `trace` / `trace_pipe` text.
pub fn parse_line(line: &str) -> Result<Event, ParseError> {
    let line = line.trim_end_matches(['\n', '\r']);
    let trimmed = line.trim_start();
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return Err(ParseError::NotEvent);
    }
    let bad = |why| ParseError::Malformed {
        line: line.to_string(),
        why,
    };
    if let Some(rest) = trimmed.strip_prefix("CPU:") {
        // `CPU:1 [LOST 123 EVENTS]`
        let (cpu, rest) = rest
            .split_once(' ')
            .ok_or_else(|| bad("no space after CPU:"))?;
        let count = rest
            .trim()
            .strip_prefix("[LOST ")
            .and_then(|r| r.strip_suffix(" EVENTS]"))
            .ok_or_else(|| bad("a CPU: line that is not a LOST line"))?;
        return Ok(Event {
            cpu: cpu.parse().map_err(|_| bad("bad CPU number"))?,
            ts: 0,
            pid: -1,
            comm: String::new(),
            tgid: None,
            kind: Kind::Lost {
                count: count.parse().map_err(|_| bad("bad LOST count"))?,
            },
        });
    }
    let (task, cpu, after) = split_task_cpu(line).ok_or_else(|| bad("no [cpu] field"))?;
    // With record-tgid: `comm-pid (  tgid)`; `(-------)` when the tgid is not known.
    let task = task.trim_end();
    let (task, tgid) = match task.strip_suffix(')').and_then(|t| t.rsplit_once('(')) {
        Some((rest, tgid)) if tgid.trim().parse::<i32>().is_ok() || tgid.starts_with('-') => {
            (rest, tgid.trim().parse::<i32>().ok())
        }
        _ => (task, None),
    };
    let (comm, pid) = task
        .trim()
        .rsplit_once('-')
        .ok_or_else(|| bad("no -pid after the command name"))?;
    let pid: i32 = pid.parse().map_err(|_| bad("bad pid"))?;
    // `<flags> <timestamp>: <event>: <fields>`; old kernels have no flags column.
    let after = after.trim_start();
    let (head, rest) = after.split_once(": ").ok_or_else(|| bad("no timestamp"))?;
    let ts_text = head.rsplit(' ').next().unwrap_or(head);
    let ts = parse_timestamp(ts_text).ok_or_else(|| bad("bad timestamp"))?;
    let (name, fields) = match rest.split_once(": ") {
        Some((n, f)) => (n, f),
        None => (rest.trim_end_matches(':'), ""),
    };
    let kind = parse_kind(name, fields).ok_or_else(|| bad("fields do not match the event"))?;
    Ok(Event {
        cpu,
        ts,
        pid,
        comm: comm.to_string(),
        tgid,
        kind,
    })
}

/// Cuts `line` at its `[ddd]` CPU field: (task, cpu, rest).
fn split_task_cpu(line: &str) -> Option<(&str, usize, &str)> {
    let bytes = line.as_bytes();
    let mut from = 0;
    while let Some(off) = line[from..].find('[') {
        let open = from + off;
        let close = line[open..].find(']').map(|c| open + c)?;
        let inner = &line[open + 1..close];
        let followed_by_space = bytes.get(close + 1) == Some(&b' ');
        if !inner.is_empty() && inner.bytes().all(|b| b.is_ascii_digit()) && followed_by_space {
            let cpu = inner.parse().ok()?;
            return Some((&line[..open], cpu, &line[close + 1..]));
        }
        from = open + 1;
    }
    None
}

/// A timestamp as nanoseconds (`4915.001579` seconds) or raw counter ticks (`4914990751983`).
fn parse_timestamp(text: &str) -> Option<u64> {
    match text.split_once('.') {
        None => text.parse().ok(),
        Some((secs, frac)) => {
            let secs: u64 = secs.parse().ok()?;
            if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let scale = 10u64.pow(9 - frac.len() as u32);
            Some(secs.checked_mul(1_000_000_000)? + frac.parse::<u64>().ok()? * scale)
        }
    }
}

/// The value of `key=` in `fields` (up to the next space).
fn field<'a>(fields: &'a str, key: &str) -> Option<&'a str> {
    let mut from = 0;
    while let Some(off) = fields[from..].find(key) {
        let at = from + off;
        let starts_word = at == 0 || fields.as_bytes()[at - 1] == b' ';
        if starts_word && fields[at + key.len()..].starts_with('=') {
            let value = &fields[at + key.len() + 1..];
            return Some(value.split(' ').next().unwrap_or(value));
        }
        from = at + key.len();
    }
    None
}

/// The event `name` with its `fields`, as a [`Kind`]; `None` when a field it needs is missing
/// or malformed.
fn parse_kind(name: &str, fields: &str) -> Option<Kind> {
    let kind = match name {
        "sched_switch" => parse_switch(fields)?,
        "workqueue_execute_start" | "workqueue_execute_end" => {
            let function = fields.rsplit_once("function ")?.1.trim().to_string();
            if name.ends_with("start") {
                Kind::WorkStart { function }
            } else {
                Kind::WorkEnd { function }
            }
        }
        "tick_stop" => Kind::TickStop {
            success: field(fields, "success")? == "1",
            dependency: field(fields, "dependency")?.to_string(),
        },
        "mm_page_pcpu_drain" => Kind::PcpDrain {
            pfn: u64::from_str_radix(field(fields, "pfn")?.trim_start_matches("0x"), 16).ok()?,
        },
        "workqueue_queue_work" => Kind::WorkQueued {
            function: field(fields, "function")?.to_string(),
            cpu: field(fields, "cpu")?.parse().ok()?,
        },
        "hrtimer_expire_entry" => Kind::TimerExpire {
            function: field(fields, "function")?.to_string(),
        },
        "irq_handler_entry" => Kind::Enter(Context::Irq(field(fields, "name")?.to_string())),
        // The exit names only the number; the timeline pairs it with the open handler.
        "irq_handler_exit" => Kind::Exit(Context::Irq(String::new())),
        "softirq_entry" | "softirq_exit" => parse_softirq(name, fields),
        "csd_function_entry" | "csd_function_exit" => {
            let func = field(fields, "func")?.trim_end_matches(',').to_string();
            if name == "csd_function_entry" {
                Kind::Enter(Context::CrossCall(func))
            } else {
                Kind::Exit(Context::CrossCall(func))
            }
        }
        _ => parse_other(name),
    };
    Some(kind)
}

/// A `sched_switch`'s fields: `prev_comm=... prev_pid=.. prev_prio=.. prev_state=.. ==>
/// next_comm=... next_pid=..`.
#[inline]
fn parse_switch(fields: &str) -> Option<Kind> {
    let (prev, next) = fields.split_once(" ==> ")?;
    Some(Kind::Switch {
        prev_comm: comm_of(prev, "prev_comm", "prev_pid")?,
        prev_pid: field(prev, "prev_pid")?.parse().ok()?,
        next_comm: comm_of(next, "next_comm", "next_pid")?,
        next_pid: field(next, "next_pid")?.parse().ok()?,
    })
}

/// The command name after `key=` in `part`: a command name can hold spaces, so it is taken up
/// to the next key, `next_key`.
#[inline]
fn comm_of(part: &str, key: &str, next_key: &str) -> Option<String> {
    let start = part.find(&format!("{key}="))? + key.len() + 1;
    let end = part[start..]
        .find(&format!(" {next_key}="))
        .map_or(part.len(), |e| start + e);
    Some(part[start..end].to_string())
}

/// A softirq's entry or exit, named by its action (`[action=TIMER]`), else by its vector.
#[inline]
fn parse_softirq(name: &str, fields: &str) -> Kind {
    let action = fields
        .split_once("[action=")
        .and_then(|(_, a)| a.strip_suffix(']'))
        .map_or_else(
            || field(fields, "vec").unwrap_or("?").to_string(),
            str::to_string,
        );
    if name == "softirq_entry" {
        Kind::Enter(Context::Softirq(action))
    } else {
        Kind::Exit(Context::Softirq(action))
    }
}

/// Any other event: an x86 vector's entry or exit (`local_timer_entry`), or one we only name.
#[inline]
fn parse_other(name: &str) -> Kind {
    let vector = |suffix| {
        name.strip_suffix(suffix)
            .filter(|v| X86_VECTORS.contains(v))
            .map(str::to_string)
    };
    if let Some(v) = vector("_entry") {
        Kind::Enter(Context::Vector(v))
    } else if let Some(v) = vector("_exit") {
        Kind::Exit(Context::Vector(v))
    } else {
        Kind::Other {
            name: name.to_string(),
        }
    }
}
