//! The emulator's sizes (issue 43): a reader follows a command on one screen at a time.
//!
//! - **no source file over 900 lines**: one concept per file, as `qpw-core` already is;
//! - **no function over 80 lines**, from its `fn` line to its closing brace, in any file of
//!   `emulator/src`: a long function names its phases, and the phases live in their own
//!   functions;
//! - **each command's entry function** (a command module's free `pub fn`) within the same 80
//!   lines, checked on its own so that the message says it is the command's outline that grew.
//!
//! The check reads `emulator/src` as text, as `layers.rs` does. The code is `rustfmt`ed, so a
//! function ends at the first line after its `fn` line that is its own indentation and `}`.

mod source_tree;

/// The most lines a source file of the emulator may have.
const FILE_LINES: usize = 900;

/// The most lines a function may have, from its `fn` line to its closing brace.
const FUNCTION_LINES: usize = 80;

/// Entry functions still over [`FUNCTION_LINES`], each with its length when this list was last
/// brought down: what remains of issue 43. The test fails when one of them grows, and when one
/// comes within the limit (so that it leaves the list). Empty when the issue is done.
const NOT_YET: &[(&str, usize)] = &[];

/// Functions of any file still over [`FUNCTION_LINES`], as [`NOT_YET`]: `("path below src/
/// name", lines)`.
const FUNCTIONS_NOT_YET: &[(&str, usize)] = &[];

/// Files still over [`FILE_LINES`], as [`NOT_YET`]: `(path below src/, lines)`.
const FILES_NOT_YET: &[(&str, usize)] = &[];

/// A function found in a file.
#[derive(Debug)]
struct Function {
    /// Its name.
    name: String,
    /// Whether it is `pub` (or `pub(...)`).
    public: bool,
    /// Its indentation: 0 for a free function.
    indent: usize,
    /// Its first line, from 1.
    line: usize,
    /// Its lines, from the `fn` line to the closing brace.
    lines: usize,
}

/// The functions with a body in `text`.
fn functions(text: &str) -> Vec<Function> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let public = trimmed.starts_with("pub ") || trimmed.starts_with("pub(");
        let rest = if public {
            trimmed.split_once(' ').map_or("", |(_, r)| r)
        } else {
            trimmed
        };
        let rest = rest
            .strip_prefix("const ")
            .unwrap_or(rest)
            .trim_start_matches("unsafe ");
        let Some(after) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name: String = after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The signature ends at the first line that ends in `{` (a body follows), `}` (a body
        // on the same line) or `;` (a declaration in a trait: no body).
        let Some(open) = lines[i..].iter().position(|l| {
            let l = l.trim_end();
            l.ends_with('{') || l.ends_with('}') || l.ends_with(';')
        }) else {
            continue;
        };
        let end = match lines[i + open].trim_end() {
            l if l.ends_with(';') => continue,
            l if l.ends_with('}') => open,
            _ => {
                let close = format!("{}}}", " ".repeat(indent));
                let Some(end) = lines[i + open..].iter().position(|l| *l == close) else {
                    continue;
                };
                open + end
            }
        };
        found.push(Function {
            name,
            public,
            indent,
            line: i + 1,
            lines: end + 1,
        });
    }
    found
}

/// Whether `rel` is a command's own module: `commands/<name>.rs` or `commands/<name>/mod.rs`.
fn is_command(rel: &str) -> bool {
    match rel.strip_prefix("commands/") {
        Some(rest) => {
            (!rest.contains('/') && rest != "mod.rs")
                || rest.split_once('/').is_some_and(|(_, f)| f == "mod.rs")
        }
        None => false,
    }
}

/// Every function of every file, as `("file:line name", lines)`, with whether it is a
/// command's entry function: a free `pub` function of a command's own module.
fn all_functions() -> Vec<(String, usize, bool)> {
    let mut all = Vec::new();
    for (rel, text) in source_tree::files() {
        for f in functions(&text) {
            let entry = is_command(&rel) && f.public && f.indent == 0;
            all.push((format!("{rel}:{} {}", f.line, f.name), f.lines, entry));
        }
    }
    all
}

/// The commands' entry functions, as `("file:line name", lines)`.
fn entry_functions() -> Vec<(String, usize)> {
    all_functions()
        .into_iter()
        .filter(|(_, _, entry)| *entry)
        .map(|(name, lines, _)| (name, lines))
        .collect()
}

/// `"file:line name"` without its line, as [`NOT_YET`] names it (a file alone stays as it is).
fn without_line(entry: &str) -> String {
    match entry.split_once(' ') {
        Some((file, name)) => format!("{} {name}", file.split(':').next().unwrap()),
        None => entry.to_string(),
    }
}

#[test]
fn smoke_the_check_finds_the_entry_functions() {
    let entries = entry_functions();
    let names: Vec<String> = entries.iter().map(|(e, _)| without_line(e)).collect();
    for expected in [
        "commands/oslat",
        "commands/cyclictest",
        "commands/run",
        "commands/report",
    ] {
        assert!(
            names.iter().any(|n| n.starts_with(expected)),
            "no entry function in {expected}: {names:?}"
        );
    }
    assert!(
        names.iter().all(|n| n.starts_with("commands/")),
        "{names:?}"
    );
}

#[test]
fn the_measure_counts_from_fn_to_its_closing_brace() {
    let text = "fn a() {\n    1\n}\n\n    pub(crate) fn b(\n        x: u8,\n    ) {\n        \
                if x > 0 {\n        }\n    }\ntrait T {\n    fn c(&self);\n    fn d() {}\n}\n";
    let found = functions(text);
    let summary: Vec<(&str, bool, usize, usize)> = found
        .iter()
        .map(|f| (f.name.as_str(), f.public, f.line, f.lines))
        .collect();
    assert_eq!(
        summary,
        [("a", false, 1, 3), ("b", true, 5, 6), ("d", false, 13, 1)]
    );
}

#[test]
fn no_source_file_is_over_900_lines() {
    let mut over = Vec::new();
    let files = source_tree::files();
    over.extend(stale(
        FILES_NOT_YET,
        files.iter().map(|(rel, _)| rel.clone()),
    ));
    for (rel, text) in files {
        let lines = text.lines().count();
        over.extend(over_limit(
            &rel,
            lines,
            FILE_LINES,
            FILES_NOT_YET,
            "split it by concept",
        ));
    }
    assert!(
        over.is_empty(),
        "\nfiles over {FILE_LINES} lines:\n{}\n",
        over.join("\n")
    );
}

/// The entries of a list of what remains that name nothing in the tree any more (moved or
/// renamed: the list must follow).
fn stale(not_yet: &[(&str, usize)], found: impl Iterator<Item = String>) -> Vec<String> {
    let found: Vec<String> = found.collect();
    not_yet
        .iter()
        .filter(|(name, _)| !found.iter().any(|f| f == name))
        .map(|(name, _)| format!("{name}: on the list but not in emulator/src (moved?)"))
        .collect()
}

/// What is wrong with `what` at `lines` against `limit` and the list of what remains, if
/// anything: over the limit and not on the list, longer than the list says, or within the
/// limit and still on the list.
fn over_limit(
    what: &str,
    lines: usize,
    limit: usize,
    not_yet: &[(&str, usize)],
    fix: &str,
) -> Option<String> {
    let key = without_line(what);
    match not_yet.iter().find(|(name, _)| *name == key) {
        Some((_, reached)) if lines > *reached => Some(format!(
            "emulator/src/{what}: {lines} lines, more than the {reached} it had come down to"
        )),
        Some(_) if lines <= limit => Some(format!(
            "emulator/src/{what}: {lines} lines, now within {limit}: take it off the list"
        )),
        None if lines > limit => Some(format!("emulator/src/{what}: {lines} lines ({fix})")),
        _ => None,
    }
}

#[test]
fn entry_functions_are_about_80_lines() {
    let entries = entry_functions();
    let mut over = stale(NOT_YET, entries.iter().map(|(e, _)| without_line(e)));
    for (entry, lines) in entries {
        let fix = "name its phases, each in its own function";
        over.extend(over_limit(&entry, lines, FUNCTION_LINES, NOT_YET, fix));
    }
    assert!(
        over.is_empty(),
        "\nentry functions over {FUNCTION_LINES} lines:\n{}\n",
        over.join("\n")
    );
}

#[test]
fn no_function_is_over_80_lines() {
    let all = all_functions();
    let mut over = stale(
        FUNCTIONS_NOT_YET,
        all.iter().map(|(f, _, _)| without_line(f)),
    );
    for (function, lines, _) in all {
        let fix = "split it into named phases, each in its own function";
        over.extend(over_limit(
            &function,
            lines,
            FUNCTION_LINES,
            FUNCTIONS_NOT_YET,
            fix,
        ));
    }
    assert!(
        over.is_empty(),
        "\nfunctions over {FUNCTION_LINES} lines:\n{}\n",
        over.join("\n")
    );
}
