//! Attribution from trace events: the parser on text recorded from this machine's kernel
//! (6.18, `x86-tsc` clock; `tests/fixtures/trace-6.18-x86-tsc.txt`), and gap matching on
//! synthetic timelines: overlapping events, an IRQ nested in a kworker's run, events that
//! straddle the window's edge, and lost events.

use qpw_emulator::trace::event::{parse_line, Context, Event, Kind, ParseError};
use qpw_emulator::trace::timeline::{Attribution, Source, Timeline};

const FIXTURE: &str = include_str!("fixtures/trace-6.18-x86-tsc.txt");

#[test]
fn smoke_every_recorded_line_parses() {
    let mut events = 0;
    for line in FIXTURE.lines() {
        match parse_line(line) {
            Ok(_) => events += 1,
            Err(ParseError::NotEvent) => assert!(line.trim_start().starts_with('#')),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(events, 900);
}

#[test]
fn recorded_lines_give_their_fields() {
    let e = parse_line(
        "     kworker/1:0-3259    [001] ..... 4915778526789: workqueue_execute_start: work \
         struct 00000000d9026a3f: function lru_add_drain_per_cpu",
    )
    .unwrap();
    assert_eq!(
        (e.cpu, e.ts, e.pid, e.comm.as_str()),
        (1, 4915778526789, 3259, "kworker/1:0")
    );
    assert_eq!(
        e.kind,
        Kind::WorkStart {
            function: "lru_add_drain_per_cpu".into()
        }
    );
    // A command name with a space, in the task column and in sched_switch's fields.
    let e = parse_line(
        " opt cbdr90np7zc-2571    [001] d..2. 4720528424483: sched_switch: prev_comm=opt \
         cbdr90np7zc prev_pid=2571 prev_prio=120 prev_state=R ==> next_comm=bash next_pid=2569 \
         next_prio=120",
    )
    .unwrap();
    assert_eq!(e.comm, "opt cbdr90np7zc");
    assert_eq!(
        e.kind,
        Kind::Switch {
            prev_pid: 2571,
            prev_comm: "opt cbdr90np7zc".into(),
            next_pid: 2569,
            next_comm: "bash".into()
        }
    );
    let e = parse_line(
        "          <idle>-0       [001] d.h1. 4914994416605: irq_handler_entry: irq=36 \
         name=virtio1-req.0",
    )
    .unwrap();
    assert_eq!((e.pid, e.comm.as_str()), (0, "<idle>"));
    assert_eq!(e.kind, Kind::Enter(Context::Irq("virtio1-req.0".into())));
    let e = parse_line(
        "          <idle>-0       [001] ..s1. 4914994433219: softirq_entry: vec=4 \
         [action=BLOCK]",
    )
    .unwrap();
    assert_eq!(e.kind, Kind::Enter(Context::Softirq("BLOCK".into())));
    let e = parse_line(
        "            bash-10112   [001] d..2. 4914990751983: csd_function_entry: \
         func=flush_tlb_func, csd=0000000000000000",
    )
    .unwrap();
    assert_eq!(
        e.kind,
        Kind::Enter(Context::CrossCall("flush_tlb_func".into()))
    );
    let e = parse_line(
        "          <idle>-0       [001] d.h1. 4914999947065: local_timer_exit: vector=236",
    )
    .unwrap();
    assert_eq!(e.kind, Kind::Exit(Context::Vector("local_timer".into())));
    // Recorded on 6.18 (not in the fixture, which predates the event).
    let e = parse_line(
        "            bash-5756    [000] d.h1. 11243025041534: hrtimer_expire_entry: \
         hrtimer=00000000aa04e0cb function=hrtimer_wakeup now=4330608722001",
    )
    .unwrap();
    assert_eq!(
        e.kind,
        Kind::TimerExpire {
            function: "hrtimer_wakeup".into()
        }
    );
    // Recorded in a 6.12 guest and on 6.18.
    let e = parse_line(
        "              sh-172     [000] dN.2.     4.293009: mm_page_pcpu_drain: \
         page=0000000092f111c8 pfn=0x102ce9 order=0 migratetype=0",
    )
    .unwrap();
    assert_eq!(e.kind, Kind::PcpDrain { pfn: 0x102ce9 });
    let e = parse_line(
        "          <idle>-0       [000] d.h2. 11243418468958: workqueue_queue_work: work \
         struct=000000004f573fee function=virtio_transport_tx_work workqueue=virtio_vsock \
         req_cpu=256 cpu=0",
    )
    .unwrap();
    assert_eq!(
        e.kind,
        Kind::WorkQueued {
            function: "virtio_transport_tx_work".into(),
            cpu: 0
        }
    );
    let e = parse_line(
        "         taskset-173     [000] d.s1.     4.466797: workqueue_queue_work: work \
         struct=0000000075cbfa9f function=flush_memcg_stats_dwork workqueue=events_unbound \
         req_cpu=8192 cpu=-1",
    )
    .unwrap();
    assert!(matches!(e.kind, Kind::WorkQueued { cpu: -1, .. }));
}

#[test]
fn the_timers_that_fire_are_counted_per_cpu() {
    let mut t = Timeline::new();
    for (cpu, ts, f) in [
        (1, 10, "tick_nohz_handler"),
        (1, 20, "tick_nohz_handler"),
        (1, 30, "hrtimer_wakeup"),
        (0, 40, "tick_nohz_handler"),
    ] {
        t.push(&Event {
            cpu,
            ts,
            pid: 7,
            comm: "oslat".into(),
            tgid: None,
            kind: Kind::TimerExpire { function: f.into() },
        });
    }
    t.finish();
    let on1: Vec<(&str, u64)> = t.cpus[&1]
        .timers
        .iter()
        .map(|(f, n)| (f.as_str(), *n))
        .collect();
    assert_eq!(on1, [("hrtimer_wakeup", 1), ("tick_nohz_handler", 2)]);
    assert_eq!(t.cpus[&0].timers["tick_nohz_handler"], 1);
}

#[test]
fn the_recorded_kernel_drains_are_found() {
    let functions: Vec<String> = FIXTURE
        .lines()
        .filter_map(|l| parse_line(l).ok())
        .filter_map(|e| match e.kind {
            Kind::WorkStart { function } => Some(function),
            _ => None,
        })
        .collect();
    for f in [
        "lru_add_drain_per_cpu",
        "flush_cpu_slab",
        "refresh_vm_stats",
    ] {
        assert!(functions.iter().any(|g| g == f), "{f} in {functions:?}");
    }
}

#[test]
fn mono_timestamps_lost_lines_and_bad_lines() {
    let e = parse_line("    bash-1 [000] ..... 4915.001579: sched_wakeup: comm=x pid=2").unwrap();
    assert_eq!(e.ts, 4_915_001_579_000);
    let e = parse_line("CPU:1 [LOST 123 EVENTS]").unwrap();
    assert_eq!((e.cpu, e.kind), (1, Kind::Lost { count: 123 }));
    assert_eq!(parse_line("# tracer: nop"), Err(ParseError::NotEvent));
    assert_eq!(parse_line(""), Err(ParseError::NotEvent));
    for bad in [
        "no cpu field here",
        "  bash-x [001] ..... 12: sched_switch: nonsense",
        "  bash-1 [001] ..... 1.2.3: sched_switch: nonsense",
        "CPU:1 [LOST many EVENTS]",
    ] {
        assert!(
            matches!(parse_line(bad), Err(ParseError::Malformed { .. })),
            "{bad} is malformed"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Synthetic timelines on cpu 1; the probe is pid 100.

const PROBE: i32 = 100;
/// The process the report is for.
const OURS: i32 = 99;

fn ev(ts: u64, pid: i32, comm: &str, kind: Kind) -> Event {
    Event {
        cpu: 1,
        ts,
        pid,
        comm: comm.into(),
        tgid: None,
        kind,
    }
}

fn switch(ts: u64, from: (i32, &str), to: (i32, &str)) -> Event {
    ev(
        ts,
        from.0,
        from.1,
        Kind::Switch {
            prev_pid: from.0,
            prev_comm: from.1.into(),
            next_pid: to.0,
            next_comm: to.1.into(),
        },
    )
}

fn timeline(events: &[Event]) -> Timeline {
    let mut t = Timeline::new();
    for e in events {
        t.push(e);
    }
    t.finish();
    t
}

const KW: (i32, &str) = (7, "kworker/1:0");
const PR: (i32, &str) = (PROBE, "oslat");

/// The probe runs from 0; a kworker runs 1000-1600 with an IRQ nested at 1200-1300; the probe
/// again until 5000.
fn kworker_with_nested_irq() -> Timeline {
    timeline(&[
        ev(0, PROBE, "oslat", Kind::Other { name: "x".into() }),
        switch(1000, PR, KW),
        ev(
            1010,
            KW.0,
            KW.1,
            Kind::WorkStart {
                function: "lru_add_drain_per_cpu".into(),
            },
        ),
        ev(
            1200,
            KW.0,
            KW.1,
            Kind::Enter(Context::Irq("virtio0".into())),
        ),
        ev(1300, KW.0, KW.1, Kind::Exit(Context::Irq(String::new()))),
        ev(
            1590,
            KW.0,
            KW.1,
            Kind::WorkEnd {
                function: "lru_add_drain_per_cpu".into(),
            },
        ),
        switch(1600, KW, PR),
        ev(5000, PROBE, "oslat", Kind::Other { name: "x".into() }),
    ])
}

#[test]
fn a_kworker_gap_is_the_kworker_with_its_function() {
    let t = kworker_with_nested_irq();
    let a = t.attribute(1, 990, 1610, PROBE);
    match &a {
        Attribution::Seen {
            source: Source::Task { comm, .. },
            function,
            others,
            ..
        } => {
            assert_eq!(comm, "kworker/1:0");
            assert_eq!(function.as_deref(), Some("lru_add_drain_per_cpu"));
            assert_eq!(*others, 1, "the nested IRQ is seen too");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a.label(OURS), "kworker lru_add_drain_per_cpu");
    assert_eq!(a.bucket(OURS), "kernel");
}

#[test]
fn an_irq_nested_in_a_kworker_owns_its_own_time() {
    let t = kworker_with_nested_irq();
    // A gap that covers mostly the IRQ: the IRQ, not the kworker.
    let a = t.attribute(1, 1190, 1310, PROBE);
    assert_eq!(a.label(OURS), "irq virtio0");
    assert_eq!(a.class(), "irq");
    // The segments do not overlap and cover the window without a hole.
    let cpu = &t.cpus[&1];
    for w in cpu.segments.windows(2) {
        assert_eq!(w[0].end, w[1].start, "{:?}", cpu.segments);
    }
    assert_eq!(cpu.segments.first().unwrap().start, 0);
    assert_eq!(cpu.segments.last().unwrap().end, 5000);
}

#[test]
fn overlapping_sources_go_to_the_one_with_most_time() {
    // In one gap: a softirq of 50, then a thread of 300.
    let other = (9, "rcu_preempt");
    let t = timeline(&[
        ev(0, PROBE, "oslat", Kind::Other { name: "x".into() }),
        ev(
            100,
            PROBE,
            "oslat",
            Kind::Enter(Context::Softirq("RCU".into())),
        ),
        ev(
            150,
            PROBE,
            "oslat",
            Kind::Exit(Context::Softirq("RCU".into())),
        ),
        switch(160, PR, other),
        switch(460, other, PR),
        ev(1000, PROBE, "oslat", Kind::Other { name: "x".into() }),
    ]);
    let a = t.attribute(1, 90, 470, PROBE);
    assert_eq!(a.label(OURS), "rcu_preempt");
    assert!(matches!(a, Attribution::Seen { others: 1, .. }));
    // A gap in which only the probe ran: nothing seen.
    assert_eq!(t.attribute(1, 600, 700, PROBE), Attribution::Unexplained);
}

#[test]
fn events_straddling_the_window_edges() {
    // The trace starts inside a timer interrupt (its exit comes first) and ends inside a
    // kworker's run (no switch back).
    let t = timeline(&[
        ev(
            100,
            PROBE,
            "oslat",
            Kind::Exit(Context::Vector("local_timer".into())),
        ),
        ev(200, PROBE, "oslat", Kind::Other { name: "x".into() }),
        switch(900, PR, KW),
        ev(
            950,
            KW.0,
            KW.1,
            Kind::WorkStart {
                function: "refresh_vm_stats".into(),
            },
        ),
        ev(1000, KW.0, KW.1, Kind::Other { name: "x".into() }),
    ]);
    assert_eq!(t.attribute(1, 110, 150, PROBE), Attribution::Unexplained);
    let a = t.attribute(1, 50, 150, PROBE);
    assert_eq!(a, Attribution::OutsideTrace, "before the first event");
    let a = t.attribute(1, 890, 1000, PROBE);
    assert_eq!(a.label(OURS), "kworker refresh_vm_stats");
    assert_eq!(
        t.attribute(1, 900, 2000, PROBE),
        Attribution::OutsideTrace,
        "past the last event"
    );
    // The timer's exit relabels the time before it, from the window's start.
    let t = timeline(&[
        ev(0, PROBE, "oslat", Kind::Other { name: "x".into() }),
        ev(
            100,
            PROBE,
            "oslat",
            Kind::Exit(Context::Vector("local_timer".into())),
        ),
        ev(200, PROBE, "oslat", Kind::Other { name: "x".into() }),
    ]);
    assert_eq!(
        t.attribute(1, 10, 90, PROBE).label(OURS),
        "vector local_timer"
    );
}

#[test]
fn a_gap_over_lost_events_is_lost_not_guessed() {
    let mut lost = ev(0, -1, "", Kind::Lost { count: 42 });
    lost.ts = 0;
    let t = timeline(&[
        ev(0, PROBE, "oslat", Kind::Other { name: "x".into() }),
        switch(100, PR, KW),
        switch(200, KW, PR),
        ev(300, PROBE, "oslat", Kind::Other { name: "x".into() }),
        lost,
        ev(800, PROBE, "oslat", Kind::Other { name: "x".into() }),
        ev(900, PROBE, "oslat", Kind::Other { name: "x".into() }),
    ]);
    assert_eq!(t.lost_events, 42);
    assert_eq!(t.attribute(1, 400, 500, PROBE), Attribution::Lost);
    assert_eq!(t.attribute(1, 90, 210, PROBE).bucket(OURS), "kernel");
    assert_eq!(t.attribute(1, 810, 890, PROBE), Attribution::Unexplained);
    assert_eq!(t.attribute(3, 10, 20, PROBE), Attribution::Unseen);
}

#[test]
fn our_worker_is_its_own_bucket() {
    let worker = (55, "qpw/1");
    let t = timeline(&[
        ev(0, PROBE, "oslat", Kind::Other { name: "x".into() }),
        switch(100, PR, worker),
        switch(130, worker, PR),
        ev(300, PROBE, "oslat", Kind::Other { name: "x".into() }),
    ]);
    let a = t.attribute(1, 95, 135, PROBE);
    assert_eq!((a.label(OURS).as_str(), a.bucket(OURS)), ("qpw/1", "qpw"));
    // The noise view counts one occurrence of 30 for the worker.
    let noise = t.noise(Some(PROBE));
    let (label, e) = &noise[0].sources[0];
    assert_eq!((label.as_str(), e.count, e.total), ("qpw/1", 1, 30));
}

#[test]
fn another_process_worker_is_not_ours() {
    let e = parse_line(
        "           qpw/1-4242    (   4200) [001] d..2. 4720518020427: sched_switch: \
         prev_comm=qpw/1 prev_pid=4242 prev_prio=120 prev_state=S ==> next_comm=oslat \
         next_pid=100 next_prio=120",
    )
    .unwrap();
    assert_eq!(
        (e.comm.as_str(), e.pid, e.tgid),
        ("qpw/1", 4242, Some(4200))
    );
    let unknown = parse_line(
        "          <idle>-0       (-------) [001] d.h1. 4914994416605: irq_handler_entry: \
         irq=36 name=virtio1-req.0",
    )
    .unwrap();
    assert_eq!((unknown.pid, unknown.tgid), (0, None));
    let foreign = (4242, "qpw/1");
    let mut out = ev(130, foreign.0, foreign.1, Kind::Other { name: "x".into() });
    out.tgid = Some(4200);
    let t = timeline(&[
        ev(0, PROBE, "oslat", Kind::Other { name: "x".into() }),
        switch(100, PR, foreign),
        out,
        switch(140, foreign, PR),
        ev(300, PROBE, "oslat", Kind::Other { name: "x".into() }),
    ]);
    let a = t.attribute(1, 95, 145, PROBE);
    assert_eq!(a.bucket(OURS), "other");
    assert_eq!(a.label(OURS), "qpw/1 (process 4200)");
    assert_eq!(a.bucket(4200), "qpw");
}
