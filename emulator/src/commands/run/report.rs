//! The report on standard output: the table, the tick on the target, the notes and warnings.

use anyhow::Result;

use crate::table::{self, Row};

use super::Ctx;

impl Ctx {
    /// Ends the run and reports it: what `--isolate` changed is put back (and kernel-pcp's
    /// held page given back) before anything waits on the reader, then the conclusions, the
    /// files, and on standard output the table, the attribution, the tick, the notes and the
    /// warnings, and where the files are.
    pub(super) fn finish(mut self) -> Result<()> {
        self.isolation = None;
        self.ready.clear();
        self.conclude();
        self.write_all()?;
        let rows = self.rows();
        print!(
            "{}",
            table::table(&rows, Some(self.target), self.threshold().map(|t| t.0))
        );
        self.print_attribution();
        self.print_tick();
        println!();
        for n in &self.notes {
            println!("note: {n}");
        }
        self.sink.print_warnings();
        println!("\nResults: {}", self.out.display());
        println!("  {}", self.out.join("summary.json").display());
        for f in &self.files {
            println!("  {f}");
        }
        Ok(())
    }

    pub(super) fn rows(&self) -> Vec<Row> {
        self.scenarios
            .iter()
            .filter(|a| a.rounds > 0)
            .map(|a| Row::from_oslat(&a.name, &self.document(a)))
            .collect()
    }

    /// Prints, under the attribution, each scenario's tick on the target and what of this run
    /// ran there besides the probe.
    pub(super) fn print_tick(&self) {
        let rows: Vec<&crate::tick::TargetTick> = self
            .scenarios
            .iter()
            .filter(|a| a.rounds > 0)
            .map(|a| &a.tick)
            .collect();
        if rows.iter().all(|t| t.local_timer.is_none()) {
            return;
        }
        println!(
            "\nThe tick on cpu {} (nohz_full: {}) and this run's own tasks there besides the probe:",
            self.target,
            if self.nohz_full { "yes" } else { "no" }
        );
        println!(
            "{:<16} {:>8} {:>8}   {:<24} {:<28} ours (runs)",
            "scenario", "LOC/s", "tick/s", "tick kept by", "other timers"
        );
        for t in rows {
            println!(
                "{:<16} {:>8} {:>8}   {:<24} {:<28} {}",
                t.scenario,
                t.local_timer_per_s
                    .map_or("-".into(), |v| format!("{v:.1}")),
                t.tick_per_s.map_or("-".into(), |v| format!("{v:.1}")),
                if t.traced_seconds > 0.0 {
                    t.kept_line()
                } else {
                    "-".into()
                },
                if t.traced_seconds > 0.0 {
                    t.other_timers()
                } else {
                    "-".into()
                },
                if t.traced_seconds > 0.0 {
                    t.ours_line()
                } else {
                    "- (no trace)".into()
                }
            );
        }
        println!(
            "(LOC/s: the target's local timer interrupts per second, /proc/interrupts, around \
             each round; tick/s and other timers: the timers that fired there, from the trace \
             (hrtimer_expire_entry); tick kept by: what kept a nohz_full cpu's tick on when it \
             tried to stop it (tick_stop; SCHED: a second runnable task); ours: the run's own tasks that took the cpu from the probe)"
        );
    }
}
