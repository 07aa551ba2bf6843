//! `qpw-emu`: see the library's documentation (`emulator/src/lib.rs`) for the commands.

use clap::Parser;

fn main() {
    // A run killed while it isolated a CPU left this process's parent, and so this process,
    // on the housekeeping CPUs: undo that before anything reads the allowed CPUs. And a run
    // killed while it had RT throttling off left it off for the whole machine: put it back.
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let mine = || qpw_emulator::isolate::get_affinity(0).ok();
        let before = mine();
        for l in qpw_emulator::isolate::recover_stale() {
            eprintln!("qpw-emu: isolation: {l}");
        }
        for l in qpw_emulator::throttling::recover_stale() {
            eprintln!("qpw-emu: {l}");
        }
        // Our own affinity was put back too, but the allowed CPUs were read before `main`
        // (qpw-core's start-up capture): start again, once, to read them afresh.
        if mine() != before && std::env::var_os("QPW_EMU_REEXEC").is_none() {
            use std::os::unix::process::CommandExt as _;
            if let Ok(exe) = std::env::current_exe() {
                let e = std::process::Command::new(exe)
                    .args(std::env::args_os().skip(1))
                    .arg0(std::env::args_os().next().unwrap_or_default())
                    .env("QPW_EMU_REEXEC", "1")
                    .exec();
                eprintln!("qpw-emu: cannot start again after putting back the CPUs ({e})");
            }
        }
    }
    let mut args = qpw_emulator::cli::args_for_invocation(std::env::args_os());
    if let Err(e) = qpw_emulator::cli::refuse_long_args(&args) {
        eprintln!("Error: {e}");
        std::process::exit(1);
    }
    let tool = args.get(1).and_then(|a| a.to_str()).map(str::to_string);
    // What cyclictest 2.4 reads from the command line's order, which clap does not see.
    let mut verbose_before_affinity = false;
    if tool.as_deref() == Some("cyclictest") {
        match qpw_emulator::cli::cyclictest_getopt(&mut args) {
            Ok(v) => verbose_before_affinity = v,
            Err(code) => std::process::exit(code),
        }
    }
    let mut cli = match qpw_emulator::cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // The drop-ins refuse as the real tools do, where those have a shape for it.
            let code = match tool.as_deref() {
                Some("oslat") => qpw_emulator::cli::oslat_refusal(&e),
                Some("cyclictest") => qpw_emulator::cli::cyclictest_refusal(&e),
                _ => None,
            };
            if let Some(code) = code {
                std::process::exit(code);
            }
            // Every refusal exits 1, as rt-tests' oslat does and our checks after parsing do
            // (clap's own would be 2); --help and --version exit 0 (README, "exit status").
            let _ = e.print();
            std::process::exit(if e.use_stderr() { 1 } else { 0 })
        }
    };
    if let Some(qpw_emulator::cli::Command::Cyclictest(a)) = cli.command.as_mut() {
        a.verbose_before_affinity = verbose_before_affinity;
    }
    if let Err(e) = qpw_emulator::commands::dispatch(cli) {
        if let Some(exit) = e.downcast_ref::<qpw_emulator::rt::Exit>() {
            std::process::exit(exit.0);
        }
        eprintln!("Error: {}", qpw_emulator::rt::error_chain(&e));
        std::process::exit(1);
    }
}
