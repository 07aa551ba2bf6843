//! The emulator's layers (the crate's "Shape"): data flows one way, parse, then run, then
//! report, and every module knows which room it is in.
//!
//! - **the command line** (`cli/`, one file per command's arguments) declares and validates arguments and imports no command;
//!   `defaults.rs`, the defaults it shows that a command also uses, imports nothing of ours;
//! - **the dispatcher** (`commands/mod.rs`) may use every command;
//! - **a command** (`commands/<name>.rs`, and any module under it) uses `cli`'s argument types
//!   and the modules below the commands, never another command nor the dispatcher;
//! - **the modules below the commands** (the rest, from `cpus.rs` and `drain.rs` down to the
//!   probes and `trace/`) use no command and not the dispatcher.
//!
//! The check reads `emulator/src` as text: comments, strings and character literals are blanked
//! out, every `use` tree is expanded, and every `crate::`, `super::` and `self::` path (and a
//! path through a child module) is resolved, from where it stands (inside an inline
//! `mod tests` too), to the deepest module of the tree it names. A breach names the file, the
//! line and the import.

use std::collections::BTreeSet;

mod source_tree;

/// A module of the crate: its path below `crate` (`commands::run`, `trace::tracefs`; empty for
/// `lib.rs`).
type Module = Vec<String>;

/// One source file.
#[derive(Debug)]
struct Source {
    /// Its path, for the messages.
    file: String,
    /// The module it is.
    module: Module,
    /// Its text.
    text: String,
}

/// Which layer a module is in.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Room {
    /// `lib.rs`: declares the modules.
    Root,
    /// `cli/mod.rs` and the files under it.
    Cli,
    /// `defaults.rs`.
    Defaults,
    /// `commands/mod.rs`.
    Dispatcher,
    /// `commands/<name>.rs` and what is under it.
    Command(String),
    /// Everything else.
    Below,
}

impl Room {
    fn of(module: &[String]) -> Room {
        match module {
            [] => Room::Root,
            [m, ..] if m == "cli" => Room::Cli,
            [m] if m == "defaults" => Room::Defaults,
            [m] if m == "commands" => Room::Dispatcher,
            [m, name, ..] if m == "commands" => Room::Command(name.clone()),
            _ => Room::Below,
        }
    }

    /// Why a reference from `self` to `to` breaks the layers, if it does.
    fn breach(&self, to: &Room) -> Option<&'static str> {
        match (self, to) {
            (Room::Command(a), Room::Command(b)) if a != b => Some(
                "a command uses cli's argument types and the modules below the commands, never \
                 another command: move what both need down",
            ),
            (Room::Command(_), Room::Dispatcher) => {
                Some("a command never reaches back into the dispatcher")
            }
            (Room::Cli, Room::Command(_) | Room::Dispatcher) => Some(
                "cli declares and validates arguments only: a default that a command also \
                 uses lives in defaults.rs",
            ),
            (Room::Below, Room::Command(_) | Room::Dispatcher) => Some(
                "a module below the commands uses none of them: move what it needs down beside it",
            ),
            (Room::Defaults, to) if *to != Room::Root => {
                Some("defaults.rs holds constants and imports nothing of ours")
            }
            _ => None,
        }
    }
}

/// The emulator's library sources (`main.rs`, the binary above everything, left out).
fn the_tree() -> Vec<Source> {
    source_tree::files()
        .into_iter()
        .filter(|(rel, _)| rel != "main.rs")
        .map(|(rel, text)| source(&format!("emulator/src/{rel}"), &rel, text))
        .collect()
}

/// The source of the file at `rel` below `src/` (`commands/run.rs`), with its module.
fn source(file: &str, rel: &str, text: String) -> Source {
    let mut module: Module = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if module.last().is_some_and(|m| m == "mod" || m == "lib") {
        module.pop();
    }
    Source {
        file: file.to_string(),
        module,
        text,
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` with its comments, strings and character literals blanked out (newlines kept, so
/// that positions and lines stay right): only code is searched.
fn code_only(text: &str) -> Vec<char> {
    let c: Vec<char> = text.chars().collect();
    let mut out = c.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in &mut out[from..to.min(c.len())] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        let ident_before = i > 0 && is_ident(c[i - 1]);
        // A line comment (doc comments included).
        if c[i] == '/' && at(i + 1) == '/' {
            let end = (i..c.len()).find(|&k| c[k] == '\n').unwrap_or(c.len());
            blank(&mut out, i, end);
            i = end;
            continue;
        }
        // A block comment, nested.
        if c[i] == '/' && at(i + 1) == '*' {
            let (mut k, mut depth) = (i + 2, 1);
            while k < c.len() && depth > 0 {
                if c[k] == '/' && at(k + 1) == '*' {
                    depth += 1;
                    k += 2;
                } else if c[k] == '*' && at(k + 1) == '/' {
                    depth -= 1;
                    k += 2;
                } else {
                    k += 1;
                }
            }
            blank(&mut out, i, k);
            i = k;
            continue;
        }
        // A raw string: r"..", r#".."#, br#".."#.
        if !ident_before && (c[i] == 'r' || (c[i] == 'b' && at(i + 1) == 'r')) {
            let mut k = if c[i] == 'b' { i + 2 } else { i + 1 };
            let hashes = (k..c.len()).take_while(|&j| c[j] == '#').count();
            k += hashes;
            if at(k) == '"' {
                let close = |j: usize| c[j] == '"' && (1..=hashes).all(|h| at(j + h) == '#');
                let end = (k + 1..c.len()).find(|&j| close(j)).unwrap_or(c.len());
                blank(&mut out, i, end + 1 + hashes);
                i = end + 1 + hashes;
                continue;
            }
        }
        // A string, with escapes.
        if c[i] == '"' {
            let mut k = i + 1;
            while k < c.len() && c[k] != '"' {
                k += if c[k] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, k + 1);
            i = k + 1;
            continue;
        }
        // A character literal ('x', '\n', '\u{..}'); a lifetime ('a) stays.
        if c[i] == '\'' {
            let end = if at(i + 1) == '\\' {
                (i + 3..c.len()).find(|&k| c[k] == '\'')
            } else if at(i + 2) == '\'' {
                Some(i + 2)
            } else {
                None
            };
            if let Some(end) = end {
                blank(&mut out, i, end + 1);
                i = end + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// One reference from a file to a module of the crate.
#[derive(Debug)]
struct Reference {
    /// The line it is on.
    line: usize,
    /// As written (`use crate::drain::ProbeLoad`, `super::resolve_drain`).
    written: String,
    /// The deepest module of the tree it names.
    target: Module,
}

/// The word at `i` if one starts there (not inside a longer word, nor after `::` or `.`).
fn word_at(code: &[char], i: usize) -> Option<String> {
    let starts = i == 0 || !(is_ident(code[i - 1]) || code[i - 1] == ':' || code[i - 1] == '.');
    if !starts || !is_ident(code[i]) || code[i].is_ascii_digit() {
        return None;
    }
    let end = (i..code.len())
        .find(|&k| !is_ident(code[k]))
        .unwrap_or(code.len());
    Some(code[i..end].iter().collect())
}

/// The inline modules of a file (`mod tests { .. }`): name and the span of their braces.
fn inline_modules(code: &[char]) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for i in 0..code.len() {
        if word_at(code, i).as_deref() != Some("mod") {
            continue;
        }
        let rest: String = code[i + 3..].iter().take(200).collect();
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|&c| is_ident(c))
            .collect();
        let after = rest.trim_start()[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = i + 3 + (rest.len() - after.len());
        let mut depth = 0;
        for (k, &ch) in code.iter().enumerate().skip(open) {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push((name.clone(), open, k));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// The paths a `use` tree names (`crate::json::{self, Envelope}` gives `crate::json` and
/// `crate::json::Envelope`), each as its segments; renames (`as x`) dropped.
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    // Tokens: words, `::`, `{`, `}`, `,`, `*`.
    let mut tokens: Vec<String> = Vec::new();
    let chars: Vec<char> = tree.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let ch = chars[i];
        if is_ident(ch) {
            let word: String = chars[i..].iter().take_while(|&&c| is_ident(c)).collect();
            i += word.chars().count();
            tokens.push(word);
        } else if ch == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push("::".into());
            i += 2;
        } else {
            if "{},*".contains(ch) {
                tokens.push(ch.to_string());
            }
            i += 1;
        }
    }
    // `x as y`: the rename goes.
    let mut kept = Vec::new();
    let mut k = 0;
    while k < tokens.len() {
        if tokens[k] == "as" {
            k += 2;
            continue;
        }
        kept.push(tokens[k].clone());
        k += 1;
    }
    let mut out = Vec::new();
    let mut pos = 0;
    use_tree(&kept, &mut pos, Vec::new(), &mut out);
    out
}

fn use_tree(tokens: &[String], pos: &mut usize, mut path: Vec<String>, out: &mut Vec<Vec<String>>) {
    while let Some(t) = tokens.get(*pos) {
        *pos += 1;
        match t.as_str() {
            "{" => {
                while tokens.get(*pos).is_some_and(|t| t != "}") {
                    use_tree(tokens, pos, path.clone(), out);
                    if tokens.get(*pos).is_some_and(|t| t == ",") {
                        *pos += 1;
                    }
                }
                *pos += 1;
                return;
            }
            "*" => break,
            "::" => {}
            "}" | "," => {
                *pos -= 1;
                break;
            }
            // `json::{self, ..}`: `json` itself.
            "self" if !path.is_empty() => {}
            word => path.push(word.to_string()),
        }
    }
    if !path.is_empty() {
        out.push(path);
    }
}

/// Every reference of `src` to a module of the tree (`modules`).
fn references(src: &Source, modules: &BTreeSet<Module>) -> Vec<Reference> {
    let code = code_only(&src.text);
    let inline = inline_modules(&code);
    let line_of = |i: usize| code[..i].iter().filter(|&&c| c == '\n').count() + 1;
    // The module in scope at `i`: the file's, and the inline modules around `i`.
    let scope_at = |i: usize| {
        let mut scope = src.module.clone();
        let mut around: Vec<_> = inline.iter().filter(|m| m.1 < i && i < m.2).collect();
        around.sort_by_key(|m| m.1);
        scope.extend(around.into_iter().map(|m| m.0.clone()));
        scope
    };
    // A path as written, from the scope at `i`, to the deepest module of the tree it names.
    let resolve = |path: &[String], i: usize| -> Option<Module> {
        let mut scope = scope_at(i);
        let mut segs = path.iter().peekable();
        match segs.peek().map(|s| s.as_str()) {
            Some("crate") => {
                scope.clear();
                segs.next();
            }
            Some("self") => {
                segs.next();
            }
            Some("super") => {
                while segs.peek().is_some_and(|s| *s == "super") {
                    scope.pop()?;
                    segs.next();
                }
            }
            // A child module of the scope; anything else (std, a crate, an imported name) is
            // not a path into the tree.
            Some(first) => {
                let mut child = scope.clone();
                child.push(first.to_string());
                if !modules.contains(&child) {
                    return None;
                }
            }
            None => return None,
        }
        let full: Module = scope.into_iter().chain(segs.cloned()).collect();
        (0..=full.len())
            .rev()
            .map(|n| full[..n].to_vec())
            .find(|m| modules.contains(m))
    };
    let mut out = Vec::new();
    let mut uses: Vec<(usize, usize)> = Vec::new();
    // The `use` declarations.
    for i in 0..code.len() {
        if word_at(&code, i).as_deref() != Some("use")
            || !code.get(i + 3).is_some_and(|c| c.is_whitespace())
        {
            continue;
        }
        let end = (i..code.len())
            .find(|&k| code[k] == ';')
            .unwrap_or(code.len());
        uses.push((i, end));
        let tree: String = code[i + 3..end].iter().collect();
        for path in expand_use(&tree) {
            if let Some(target) = resolve(&path, i) {
                out.push(Reference {
                    line: line_of(i),
                    written: format!("use {}", path.join("::")),
                    target,
                });
            }
        }
    }
    // Paths elsewhere: `crate::x`, `super::x`, `self::x`, `child::x`.
    for i in 0..code.len() {
        if uses.iter().any(|&(a, b)| a <= i && i < b) {
            continue;
        }
        let Some(first) = word_at(&code, i) else {
            continue;
        };
        let mut path = vec![first];
        let mut k = i + path[0].chars().count();
        while code.get(k) == Some(&':') && code.get(k + 1) == Some(&':') {
            let word: String = code[k + 2..].iter().take_while(|&&c| is_ident(c)).collect();
            if word.is_empty() {
                break;
            }
            k += 2 + word.chars().count();
            path.push(word);
        }
        if path.len() < 2 {
            continue;
        }
        if let Some(target) = resolve(&path, i) {
            out.push(Reference {
                line: line_of(i),
                written: path.join("::"),
                target,
            });
        }
    }
    out
}

/// Every breach of the layers in `tree`, one line each: file, line, import, target and rule.
fn breaches(tree: &[Source]) -> Vec<String> {
    let modules: BTreeSet<Module> = tree.iter().map(|s| s.module.clone()).collect();
    let mut out = Vec::new();
    for src in tree {
        let from = Room::of(&src.module);
        for r in references(src, &modules) {
            if r.target.starts_with(&src.module) {
                continue;
            }
            if let Some(rule) = from.breach(&Room::of(&r.target)) {
                out.push(format!(
                    "{}:{}: `{}` reaches `crate::{}`: {rule}",
                    src.file,
                    r.line,
                    r.written,
                    r.target.join("::")
                ));
            }
        }
    }
    out
}

/// A made-up tree: (path below `src/`, text).
fn made_up(files: &[(&str, &str)]) -> Vec<Source> {
    let mut tree: Vec<Source> = [
        "lib.rs",
        "cli.rs",
        "defaults.rs",
        "cpus.rs",
        "commands/mod.rs",
        "commands/oslat.rs",
        "commands/run.rs",
    ]
    .iter()
    .filter(|rel| !files.iter().any(|f| f.0 == **rel))
    .map(|rel| source(rel, rel, String::new()))
    .collect();
    tree.extend(
        files
            .iter()
            .map(|(rel, text)| source(rel, rel, text.to_string())),
    );
    tree
}

#[test]
fn smoke_the_tree_has_its_rooms_and_the_check_sees_its_imports() {
    let tree = the_tree();
    let commands: BTreeSet<String> = tree
        .iter()
        .filter_map(|s| match Room::of(&s.module) {
            Room::Command(name) => Some(name),
            _ => None,
        })
        .collect();
    let expected = [
        "cyclictest",
        "load",
        "oslat",
        "pool",
        "report",
        "resctrl",
        "run",
        "trace",
    ];
    assert_eq!(
        commands,
        expected
            .iter()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>()
    );
    for room in [Room::Cli, Room::Defaults, Room::Dispatcher] {
        assert!(
            tree.iter().any(|s| Room::of(&s.module) == room),
            "no {room:?} in emulator/src"
        );
    }
    // The check reads what is there: the dispatcher reaches every command, the oslat drop-in
    // the drain load, the default experiment the CPUs and the probe.
    let modules: BTreeSet<Module> = tree.iter().map(|s| s.module.clone()).collect();
    let targets = |file: &str| -> BTreeSet<String> {
        let src = tree.iter().find(|s| s.file == file).unwrap();
        references(src, &modules)
            .into_iter()
            .map(|r| r.target.join("::"))
            .collect()
    };
    let dispatched = targets("emulator/src/commands/mod.rs");
    for c in expected {
        assert!(
            dispatched.contains(&format!("commands::{c}")),
            "{dispatched:?}"
        );
    }
    assert!(targets("emulator/src/commands/oslat.rs").contains("drain"));
    // The default experiment is a module directory: what its files reach, together.
    let run: BTreeSet<String> = tree
        .iter()
        .filter(|s| s.file.starts_with("emulator/src/commands/run/"))
        .flat_map(|s| targets(&s.file))
        .collect();
    assert!(run.contains("cpus") && run.contains("oslat"), "{run:?}");
}

#[test]
fn no_command_reaches_another_command_or_the_dispatcher() {
    let found: Vec<String> = breaches(&the_tree())
        .into_iter()
        .filter(|b| b.starts_with("emulator/src/commands/"))
        .collect();
    assert!(found.is_empty(), "\n{}\n", found.join("\n"));
}

#[test]
fn cli_and_the_modules_below_the_commands_reach_no_command() {
    let found: Vec<String> = breaches(&the_tree())
        .into_iter()
        .filter(|b| !b.starts_with("emulator/src/commands/"))
        .collect();
    assert!(found.is_empty(), "\n{}\n", found.join("\n"));
}

#[test]
fn a_command_reaching_another_is_named_with_its_file_line_and_import() {
    let tree = made_up(&[(
        "commands/oslat.rs",
        "use std::time::Duration;\n\nuse crate::commands::run::X;\nuse crate::cpus::Cpus;\n",
    )]);
    assert_eq!(
        breaches(&tree),
        [
            "commands/oslat.rs:3: `use crate::commands::run::X` reaches `crate::commands::run`: a \
          command uses cli's argument types and the modules below the commands, never another \
          command: move what both need down"
        ]
    );
}

#[test]
fn super_paths_resolve_from_where_they_stand() {
    let tree = made_up(&[(
        "commands/oslat.rs",
        "use super::{Cpus, run};\n\
         fn f() { let _ = super::run::default_args(); }\n\
         #[cfg(test)]\nmod tests {\n    use super::*;\n    fn g() { super::f(); }\n}\n",
    )]);
    let found = breaches(&tree);
    // `super::Cpus` is the dispatcher's, `super::run` a command, twice; `super::*` in the
    // tests is the file's own.
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(
        found[0].starts_with(
            "commands/oslat.rs:1: `use super::Cpus` reaches `crate::commands`: a command never \
             reaches back"
        ),
        "{found:#?}"
    );
    assert!(
        found[1]
            .starts_with("commands/oslat.rs:1: `use super::run` reaches `crate::commands::run`"),
        "{found:#?}"
    );
    assert!(
        found[2].starts_with(
            "commands/oslat.rs:2: `super::run::default_args` reaches `crate::commands::run`"
        ),
        "{found:#?}"
    );
}

#[test]
fn grouped_and_renamed_imports_are_each_checked() {
    let tree = made_up(&[
        (
            "cpus.rs",
            "pub(crate) use crate::{defaults::X, commands::{self as c, run::{Y, Z as W}}};\n",
        ),
        (
            "cli.rs",
            "const D: &str = crate::commands::run::BUSY_OWNER;\n",
        ),
        ("defaults.rs", "use crate::cpus::Cpus;\n"),
    ]);
    let found = breaches(&tree);
    let lines: Vec<&str> = found
        .iter()
        .map(|b| b.split(": ").nth(1).unwrap())
        .collect();
    assert_eq!(
        lines,
        [
            "`use crate::commands` reaches `crate::commands`",
            "`use crate::commands::run::Y` reaches `crate::commands::run`",
            "`use crate::commands::run::Z` reaches `crate::commands::run`",
            "`crate::commands::run::BUSY_OWNER` reaches `crate::commands::run`",
            "`use crate::cpus::Cpus` reaches `crate::cpus`",
        ],
        "{found:#?}"
    );
}

#[test]
fn comments_strings_and_characters_are_not_imports() {
    let tree = made_up(&[(
        "cpus.rs",
        "//! See [`crate::commands::run`].\n\
         /* crate::commands::run /* nested */ crate::commands */\n\
         const A: &str = \"crate::commands::run\";\n\
         const B: &str = r#\"\"crate::commands::run\"#;\n\
         const C: char = '\"';\n\
         fn f<'a>(x: &'a str) -> &'a str { x }\n\
         use crate::commands::oslat;\n",
    )]);
    let found = breaches(&tree);
    // Only the last line is code; the quote in a character literal and the lifetimes do not
    // hide it.
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with("cpus.rs:7: `use crate::commands::oslat`"),
        "{found:#?}"
    );
}

#[test]
fn a_command_may_use_cli_its_own_modules_and_the_layers_below() {
    let tree = made_up(&[
        (
            "commands/run.rs",
            "mod table;\nuse crate::cli::RunArgs;\nuse crate::cpus::Cpus;\nuse table::Row;\n\
             use self::table::Col;\nfn f() { crate::commands::run::table::g(); }\n",
        ),
        (
            "commands/run/table.rs",
            "use super::super::run::f;\nuse crate::defaults::X;\n",
        ),
        (
            "commands/mod.rs",
            "pub mod oslat;\npub mod run;\nfn d() { run::f(); oslat::g(); }\n",
        ),
    ]);
    assert_eq!(breaches(&tree), Vec::<String>::new());
}
