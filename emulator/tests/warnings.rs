//! Every warning line a command prints is said through its sink (issue 43): `warning: ...` of
//! ours and `WARN: ...` of cyclictest's own, so that their order is decided in one place
//! (`emulator/src/sink.rs`), and ours are gathered for the report and the JSON.
//!
//! The check reads `emulator/src` as text, as `layers.rs` and `sizes.rs` do: a print macro
//! whose format string starts with one of the two prefixes, anywhere but in the sink, fails.
//! A line written into a report's text (`pool`'s and `resctrl`'s failed checks, among their
//! figures) is not a print of its own and is not looked at.

mod source_tree;

/// The prefixes of a warning line.
const PREFIXES: [&str; 2] = ["\"warning: ", "\"WARN: "];

/// The print macros that write a line to a standard stream.
const MACROS: [&str; 4] = ["println!(", "eprintln!(", "print!(", "eprint!("];

/// Where in `text` a print macro starts its format string with a warning's prefix, as
/// `line number: line`.
fn warning_prints(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for m in MACROS {
        let mut from = 0;
        while let Some(at) = text[from..].find(m) {
            let start = from + at;
            let after = text[start + m.len()..].trim_start();
            // `println!(` is also the end of `eprintln!(`: count it once, as the longer one.
            let inside_longer = m.starts_with('p') && text[..start].ends_with('e');
            if !inside_longer && PREFIXES.iter().any(|p| after.starts_with(p)) {
                let line = text[..start].lines().count().max(1);
                let shown = text.lines().nth(line - 1).unwrap_or("").trim();
                found.push((line, format!("{line}: {shown}")));
            }
            from = start + m.len();
        }
    }
    found.sort();
    found.into_iter().map(|(_, f)| f).collect()
}

#[test]
fn the_check_finds_a_warning_printed_in_one_line_or_over_several() {
    let text = "fn a() {\n    eprintln!(\"warning: x {y}\");\n    println!(\n        \"WARN: \
                z\"\n    );\n    eprintln!(\"# qpw-emu: warning: not at the start\");\n    \
                let _ = writeln!(s, \"warning: a report's line\");\n}\n";
    assert_eq!(
        warning_prints(text),
        ["2: eprintln!(\"warning: x {y}\");", "3: println!("]
    );
}

#[test]
fn every_warning_line_is_said_through_the_sink() {
    let mut outside = Vec::new();
    let mut in_sink = 0;
    for (rel, text) in source_tree::files() {
        let found = warning_prints(&text);
        if rel == "sink.rs" {
            in_sink += found.len();
        } else {
            outside.extend(found.into_iter().map(|f| format!("emulator/src/{rel}:{f}")));
        }
    }
    assert!(
        in_sink > 0,
        "the sink prints no warning line: the check looks for the wrong thing"
    );
    assert!(
        outside.is_empty(),
        "\nwarning lines printed outside the sink (say them with Sink::warn, defer or tool_warn):\n{}\n",
        outside.join("\n")
    );
}
