//! `qpw-emu`: see the library's documentation (`emulator/src/lib.rs`) for the commands.

use clap::Parser;

fn main() {
    let cli = qpw_emulator::cli::Cli::parse();
    if let Err(e) = qpw_emulator::commands::dispatch(cli) {
        eprintln!("Error: {}", qpw_emulator::rt::error_chain(&e));
        std::process::exit(1);
    }
}
