//! `qpw-emu`: see the library's documentation (`emulator/src/lib.rs`) for the commands.

use clap::Parser;

fn main() {
    let args = qpw_emulator::cli::args_for_invocation(std::env::args_os());
    let cli = qpw_emulator::cli::Cli::parse_from(args);
    if let Err(e) = qpw_emulator::commands::dispatch(cli) {
        if let Some(exit) = e.downcast_ref::<qpw_emulator::commands::Exit>() {
            std::process::exit(exit.0);
        }
        eprintln!("Error: {}", qpw_emulator::rt::error_chain(&e));
        std::process::exit(1);
    }
}
