//! How the tools are invoked, as rt-tests' own: under their names through a link, with
//! getopt's reading of the command line, and its messages and exit codes for what it refuses.

use super::Cli;

/// The longest argument taken: a path's limit (`PATH_MAX`, 4096 bytes); no option takes more.
pub const MAX_ARG_BYTES: usize = 4096;

/// Refuses an argument longer than [`MAX_ARG_BYTES`], quoting only its start, so that a value
/// pasted by mistake (100 kB) is neither parsed nor echoed whole by the messages that quote it.
pub fn refuse_long_args(args: &[std::ffi::OsString]) -> Result<(), String> {
    match args
        .iter()
        .enumerate()
        .find(|(_, a)| a.len() > MAX_ARG_BYTES)
    {
        Some((i, a)) => Err(format!(
            "argument {i} is {} bytes long ({}): no option takes more than {MAX_ARG_BYTES}",
            a.len(),
            crate::validate::quote(&a.to_string_lossy())
        )),
        None => Ok(()),
    }
}

/// The arguments as clap should see them: when the binary is called through a link named
/// `oslat` or `cyclictest` (a drop-in for the real tool), the command name is put in front.
pub fn args_for_invocation(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut args: Vec<_> = args.into_iter().collect();
    let called = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .map(str::to_string);
    if let Some(tool @ ("oslat" | "cyclictest")) = called.as_deref() {
        args.insert(1, tool.into());
    }
    args
}

/// Whether the program was called by a real tool's name (`oslat`, `cyclictest`: a link), so
/// that messages name it as the tool would.
pub fn called_as_tool(argv0: &str) -> bool {
    let name = std::path::Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str());
    matches!(name, Some("oslat" | "cyclictest"))
}

/// What oslat 2.4 prints for a command line it refuses, for a refusal of clap's: getopt's
/// `oslat: invalid option -- 'x'` (or `unrecognized option '--x'`, `option requires an argument
/// -- 'D'`) on stderr and the usage on stdout, or oslat's own `Illegal runtime: abc` and
/// `Illegal bucket size: 2000 (should be: 4-1024)` after its version line; exit status 1, as
/// oslat's. Returns the exit status when it printed, `None` for errors oslat has no shape for
/// (clap's message stands).
pub fn oslat_refusal(e: &clap::Error) -> Option<i32> {
    use clap::error::{ContextKind, ErrorKind};
    let ctx = |k| error_context(e, k);
    match e.kind() {
        ErrorKind::UnknownArgument => {
            let arg = ctx(ContextKind::InvalidArg)?;
            say_unknown_option("oslat", &arg);
            print!("{}", subcommand_help("oslat"));
            Some(1)
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let arg = ctx(ContextKind::InvalidArg)?;
            let value = ctx(ContextKind::InvalidValue).unwrap_or_default();
            // A value left out (getopt's line); an empty one given (`-D ''`) is a bad value.
            if value.is_empty() && e.kind() == ErrorKind::InvalidValue {
                let short = short_of("oslat", &arg)?;
                eprintln!("oslat: option requires an argument -- '{short}'");
                print!("{}", subcommand_help("oslat"));
                return Some(1);
            }
            let line = if arg.starts_with("--duration") {
                format!("Illegal runtime: {value}")
            } else if arg.starts_with("--bucket-size") {
                format!("Illegal bucket size: {value} (should be: 4-1024)")
            } else if arg.starts_with("--rtprio") {
                format!("Illegal RT priority: {value} (should be: 1-99)")
            } else if arg.starts_with("--trace-threshold") {
                "Parameter --trace-threshold needs to be positive".to_string()
            } else if arg.starts_with("--workload-mem") {
                format!("Unknown workload memory size '{value}'.\n")
            } else if arg.starts_with("--workload ") {
                // oslat's own line, and the blank line it ends with.
                format!("Unknown workload '{value}'.  Please choose from: 'no', 'memmove'\n")
            } else {
                return None;
            };
            println!("oslat V 2.40");
            println!("{line}");
            // And ours, which says what is legal.
            let ours = e.to_string();
            let ours = ours.lines().next().unwrap_or_default();
            eprintln!("qpw-emu: {}", ours.trim_start_matches("error: "));
            Some(1)
        }
        _ => None,
    }
}

/// What cyclictest 2.4 prints for a command line clap refuses. An unknown option (getopt's
/// `cyclictest: unrecognized option '--x'` or `invalid option -- 'k'`) and a missing argument
/// (`option requires an argument -- 'i'`) print that line on stderr and the usage on stdout,
/// exit status 0 (2.4 treats them as `--help`). A bad value prints the usage and exits 1 where
/// 2.4 refuses it (`-p 200`, `-h -1`, `-c 5`), with our reason, which names the flag and the
/// legal range, on stderr; where 2.4 reads a bad value as 0 and runs on (`-i abc`, `-l x`) we
/// refuse it the same way (README). `None` for other errors (clap's message stands).
pub fn cyclictest_refusal(e: &clap::Error) -> Option<i32> {
    use clap::error::{ContextKind, ErrorKind};
    let ctx = |k| error_context(e, k);
    let usage = || print!("{}", subcommand_help("cyclictest"));
    match e.kind() {
        ErrorKind::UnknownArgument => {
            let arg = ctx(ContextKind::InvalidArg)?;
            say_unknown_option("cyclictest", &arg);
            usage();
            Some(0)
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let arg = ctx(ContextKind::InvalidArg)?;
            // A value left out (getopt's line); an empty one given (`-D ''`) is a bad value.
            if ctx(ContextKind::InvalidValue)
                .unwrap_or_default()
                .is_empty()
                && e.kind() == ErrorKind::InvalidValue
            {
                match short_of("cyclictest", &arg) {
                    Some(c) => eprintln!("cyclictest: option requires an argument -- '{c}'"),
                    None => eprintln!(
                        "cyclictest: option '{}' requires an argument",
                        arg.split(' ').next().unwrap_or_default()
                    ),
                }
                usage();
                return Some(0);
            }
            usage();
            let ours = e.to_string();
            let ours = ours.lines().next().unwrap_or_default();
            eprintln!("qpw-emu: {}", ours.trim_start_matches("error: "));
            Some(1)
        }
        _ => None,
    }
}

/// A clap error's context of this kind, as text.
fn error_context(e: &clap::Error, kind: clap::error::ContextKind) -> Option<String> {
    match e.get(kind) {
        Some(clap::error::ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    }
}

/// getopt's line on stderr for an option `tool` does not know: `tool: unrecognized option
/// '--x'`, or `tool: invalid option -- 'x'` for a short one.
fn say_unknown_option(tool: &str, arg: &str) {
    match arg.strip_prefix("--") {
        Some(_) => eprintln!("{tool}: unrecognized option '{arg}'"),
        None => eprintln!(
            "{tool}: invalid option -- '{}'",
            arg.trim_start_matches('-').chars().next().unwrap_or('?')
        ),
    }
}

/// The short letter of the flag a clap error names (`--duration <TIME>`), in a subcommand.
fn short_of(subcommand: &str, named: &str) -> Option<char> {
    use clap::CommandFactory;
    let long = named
        .trim_start_matches('-')
        .split(' ')
        .next()
        .unwrap_or("");
    Cli::command()
        .find_subcommand(subcommand)?
        .get_arguments()
        .find(|a| a.get_long() == Some(long))?
        .get_short()
}

/// What rt-tests 2.4's cyclictest makes of its command line's order, which clap does not see:
/// read with getopt's rules before clap parses `args` (the whole command line, `cyclictest`
/// at index 1), and `args` rewritten where 2.4 reads a word differently.
///
/// - `-a`, `-A`, `-t` and `--secaligned` take an optional argument; 2.4 also takes the next
///   word as it, but only a number (for `-a` also a word starting with `0`, `!`, `+` or `a`).
///   Any other next word is not theirs (`-t abc`: a thread per CPU, `abc` ignored), so it is
///   moved after a `--` at the end, where the ignored words go.
/// - `-a` before `-S/--smp` is fatal in 2.4 (`FATAL: numa and smp options are mutually
///   exclusive`, exit 1; the other order only warns): `Err(1)` once that is printed.
/// - `-v` before `-a CPUSET` makes 2.4 print `Using N cpus.` once more: the returned flag.
pub fn cyclictest_getopt(args: &mut Vec<std::ffi::OsString>) -> Result<bool, i32> {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    // Built, so that every option says how many arguments it takes.
    cmd.build();
    let Some(sub) = cmd.find_subcommand("cyclictest") else {
        return Ok(false);
    };
    let options = Getopt { sub };
    let mut order = Order::default();
    let mut moved = Vec::new();
    let mut i = 2;
    while i < args.len() {
        let Some(word) = args[i].to_str().map(str::to_string) else {
            i += 1;
            continue;
        };
        if word == "--" {
            break;
        }
        let (arg, attached) = options.option_of(&word, &mut order)?;
        i += 1;
        let Some(a) = arg else { continue };
        order.seen(a.get_id().as_str())?;
        let id = a.get_id().as_str().to_string();
        if id == "affinity" {
            order.affinity_seen = true;
        }
        match Getopt::takes(a) {
            1 if !attached => i += 1,
            2 if !attached => order.optional_argument(args, &mut i, &id, &mut moved),
            _ if id == "affinity" && order.verbose_seen => {
                order.verbose_before_affinity = attached;
            }
            _ => {}
        }
    }
    if !moved.is_empty() {
        if !args.iter().any(|a| a == "--") {
            args.push("--".into());
        }
        args.extend(moved);
    }
    Ok(order.verbose_before_affinity)
}

/// cyclictest's options as getopt finds them in a word: by short letter, by long name or by a
/// long name's unique prefix.
struct Getopt<'a> {
    /// The built `cyclictest` subcommand.
    sub: &'a clap::Command,
}

impl<'a> Getopt<'a> {
    /// How an option takes its argument: 0 none, 1 required, 2 optional.
    fn takes(a: &clap::Arg) -> u8 {
        match a.get_num_args() {
            Some(n) if n.min_values() == 1 => 1,
            Some(n) if n.max_values() == 1 => 2,
            _ => 0,
        }
    }

    /// The option with short letter `c`.
    fn by_short(&self, c: char) -> Option<&'a clap::Arg> {
        self.sub.get_arguments().find(|a| a.get_short() == Some(c))
    }

    /// The option with long name `name`, or the only one whose long name starts with it.
    fn by_long(&self, name: &str) -> Option<&'a clap::Arg> {
        let exact = self
            .sub
            .get_arguments()
            .find(|a| a.get_long() == Some(name));
        let mut prefixed = self
            .sub
            .get_arguments()
            .filter(|a| a.get_long().is_some_and(|l| l.starts_with(name)));
        exact.or_else(|| match (prefixed.next(), prefixed.next()) {
            (Some(a), None) => Some(a),
            _ => None,
        })
    }

    /// The option `word` is, and whether its argument is attached. In a cluster of short
    /// options, the ones before the first that takes an argument are noted in `order`.
    fn option_of(
        &self,
        word: &str,
        order: &mut Order,
    ) -> Result<(Option<&'a clap::Arg>, bool), i32> {
        if let Some(long) = word.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, _)) => (n, true),
                None => (long, false),
            };
            return Ok((self.by_long(name), value));
        }
        if !(word.len() > 1 && word.starts_with('-')) {
            return Ok((None, false));
        }
        // A cluster of short options: walk it until one takes an argument.
        for (at, c) in word.char_indices().skip(1) {
            let Some(a) = self.by_short(c) else { break };
            if Self::takes(a) > 0 {
                return Ok((Some(a), at + c.len_utf8() < word.len()));
            }
            order.seen(a.get_id().as_str())?;
        }
        Ok((None, false))
    }
}

/// What the order of cyclictest's options has shown so far.
#[derive(Default)]
struct Order {
    /// `-a` was given.
    affinity_seen: bool,
    /// `-v` was given.
    verbose_seen: bool,
    /// `-v` came before an `-a` with a CPU set: the flag [`cyclictest_getopt`] returns.
    verbose_before_affinity: bool,
}

impl Order {
    /// What one option changes in the order's state: `-v` noted, `-S` after `-a` fatal.
    fn seen(&mut self, id: &str) -> Result<(), i32> {
        match id {
            "verbose" => self.verbose_seen = true,
            "smp" if self.affinity_seen => {
                eprintln!("FATAL: numa and smp options are mutually exclusive");
                return Err(1);
            }
            _ => {}
        }
        Ok(())
    }

    /// An option `id` with an optional argument not attached: takes the word at `i` as it
    /// when 2.4 would (stepping `i` past it), or moves it into `moved` when 2.4 ignores it.
    fn optional_argument(
        &mut self,
        args: &mut Vec<std::ffi::OsString>,
        i: &mut usize,
        id: &str,
        moved: &mut Vec<std::ffi::OsString>,
    ) {
        let next = args.get(*i).and_then(|w| w.to_str()).map(str::to_string);
        let Some(next) = next else { return };
        let theirs =
            atoi_nonzero(&next) || (id == "affinity" && next.starts_with(['0', '!', '+', 'a']));
        if id == "affinity" && self.verbose_seen {
            self.verbose_before_affinity = theirs;
        }
        if theirs {
            *i += 1;
        } else if !next.starts_with('-') {
            moved.push(args.remove(*i));
        }
    }
}

/// 2.4's test for taking the next word as an optional argument: atoi() of it is not 0.
fn atoi_nonzero(w: &str) -> bool {
    let t = w.trim_start();
    let t = t.strip_prefix(['+', '-']).unwrap_or(t);
    t.chars().take_while(char::is_ascii_digit).any(|c| c != '0')
}

/// A subcommand's `--help` text, as the drop-ins' refusals print it for their usage.
fn subcommand_help(name: &str) -> String {
    use clap::CommandFactory;
    Cli::command()
        .find_subcommand_mut(name)
        .map(|c| c.render_help().to_string())
        .unwrap_or_default()
}

/// Says on stderr that a drop-in ignored words that are not options, as the real tool does.
pub fn note_stray(tool: &str, words: &[String]) {
    if !words.is_empty() {
        eprintln!(
            "qpw-emu {tool}: ignoring `{}`: not options ({tool} 2.4 ignores such words too)",
            words.join(" ")
        );
    }
}
