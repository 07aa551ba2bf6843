//! The path one call of a function takes through its machine code, found by running the code
//! in a small x86-64 interpreter over a snapshot of this process's memory: the instructions
//! the CPU would execute, counted without hardware counters, single-stepping or guessing.
//!
//! Why an interpreter: the owner's path of a restartable-sequence lock cannot be stepped
//! (every trap is a preemption, which aborts the sequence), these VMs have no performance
//! counters, and which way each branch goes depends on the state (is the thread bound, is
//! the slot's lock a `FencedLock` or a `FairLock`, does the sequence find its CPU): reading
//! that state is exactly what the code does, so the interpreter does it too.
//!
//! What it models is small on purpose: the integer moves, arithmetic, compares and branches
//! that straight-line lock paths are made of (objdump's Intel syntax). Loads read the live
//! process (through `/proc/self/mem`, so that a wrong address is an error, not a crash); stores
//! go to a private overlay, so the lock is never really taken and no restartable sequence is
//! armed; the stack is a fake one. A `call`, an indirect jump (a tail call), a branch out of
//! the function (an rseq abort handler sits in its own section) or an instruction it does not
//! know ends the walk with an error that names the instruction: on an uncontended owner path
//! none of these happens, so each is either a slow path taken (the test's setup is wrong) or
//! code the interpreter must learn.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

/// One instruction of objdump's listing.
#[derive(Debug, Clone)]
pub(crate) struct Insn {
    /// Its address in the executable (before relocation).
    pub(crate) addr: u64,
    /// The instruction as objdump printed it (Intel syntax).
    pub(crate) text: String,
}

impl Insn {
    /// Whether the instruction is an atomic read-modify-write: a `lock` prefix, or an `xchg`
    /// with a memory operand (locked without the prefix).
    pub(crate) fn is_locked(&self) -> bool {
        let (mnemonic, operands) = split_mnemonic(&self.text);
        mnemonic == "lock" || (mnemonic == "xchg" && operands.contains('['))
    }
}

/// A function's listing, from `objdump -d -M intel` of `exe`.
#[derive(Debug)]
pub(crate) struct Listing {
    /// The function's address in the executable.
    pub(crate) start: u64,
    /// Its instructions, in address order.
    pub(crate) insns: Vec<Insn>,
}

impl Listing {
    /// Disassembles `symbol` of `exe` (an unmangled `#[no_mangle]` name).
    pub(crate) fn of(exe: &Path, symbol: &str) -> Result<Listing, String> {
        let out = Command::new("objdump")
            .args(["-d", "-M", "intel", "--no-show-raw-insn", "-w"])
            .arg(format!("--disassemble={symbol}"))
            .arg(exe)
            .output()
            .map_err(|e| format!("objdump: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "objdump failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let header = format!("<{symbol}>:");
        let mut lines = text.lines().skip_while(|l| !l.ends_with(&header));
        let start = lines
            .next()
            .and_then(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
            .ok_or_else(|| format!("{symbol} is not in {}", exe.display()))?;
        let insns = lines
            .take_while(|l| !l.trim().is_empty())
            .filter_map(|l| {
                let (addr, rest) = l.split_once(':')?;
                let addr = u64::from_str_radix(addr.trim(), 16).ok()?;
                let text = rest.trim().to_string();
                (!text.is_empty()).then_some(Insn { addr, text })
            })
            .collect();
        Ok(Listing { start, insns })
    }

    /// The listing as objdump printed it, for failure messages.
    pub(crate) fn render(&self) -> String {
        self.insns
            .iter()
            .map(|i| format!("  {:x}:\t{}\n", i.addr, i.text))
            .collect()
    }
}

/// The instructions one call executed, in order.
#[derive(Debug)]
pub(crate) struct Walk {
    /// Indices into the listing.
    pub(crate) steps: Vec<usize>,
}

impl Walk {
    /// The executed instructions as text, one a line, for reports and failure messages.
    pub(crate) fn render(&self, listing: &Listing) -> String {
        self.steps
            .iter()
            .map(|&i| {
                let insn = &listing.insns[i];
                format!("  {:x}:\t{}\n", insn.addr, insn.text)
            })
            .collect()
    }
}

/// Where the fake stack lives: far from anything mapped in a small test process.
const STACK_TOP: u64 = 0x7e00_0000_0000;
const STACK_SIZE: u64 = 1 << 16;
/// The return address the walk ends at.
const RETURN_TO: u64 = 0xdead_beef_0000;
/// A walk longer than this is a loop the uncontended path should not have.
const MAX_STEPS: usize = 2000;

/// Follows one call of the function at run-time address `entry` (whose listing is `listing`)
/// with `args` as its integer arguments (`rdi`, `rsi`, `rdx`, `rcx`, `r8`, `r9`: a function
/// that returns a large value through memory takes the place for it first), from the calling
/// thread's state.
pub(crate) fn follow(listing: &Listing, entry: u64, args: &[u64]) -> Result<Walk, String> {
    let mut m = Machine::new(entry.wrapping_sub(listing.start))?;
    const ARGUMENT_REGISTERS: [usize; 6] = [7, 6, 2, 1, 8, 9];
    if args.len() > ARGUMENT_REGISTERS.len() {
        return Err(format!("{} arguments: at most 6 in registers", args.len()));
    }
    for (&reg, &arg) in ARGUMENT_REGISTERS.iter().zip(args) {
        m.set(Reg::full(reg), arg);
    }
    let by_addr: HashMap<u64, usize> = listing
        .insns
        .iter()
        .enumerate()
        .map(|(i, insn)| (insn.addr, i))
        .collect();
    let mut at = 0;
    let mut steps = Vec::new();
    loop {
        if steps.len() == MAX_STEPS {
            return Err(format!("no `ret` after {MAX_STEPS} instructions: a loop"));
        }
        steps.push(at);
        let insn = &listing.insns[at];
        let next = listing.insns.get(at + 1).map(|i| i.addr);
        let flow = m
            .step(insn, next)
            .map_err(|e| format!("at {:x} `{}`: {e}", insn.addr, insn.text))?;
        let to = match flow {
            Flow::Next => next.ok_or("ran off the end of the function")?,
            Flow::Jump(to) => to,
            Flow::Return => return Ok(Walk { steps }),
        };
        at = *by_addr.get(&to).ok_or_else(|| {
            format!(
                "at {:x} `{}`: jumps to {to:x}, outside the function (an rseq abort \
                 handler, or a section of its own): not the uncontended path",
                insn.addr, insn.text
            )
        })?;
    }
}

/// What an instruction does to the flow of control.
enum Flow {
    Next,
    Jump(u64),
    Return,
}

/// A general-purpose register and the part of it an operand names.
#[derive(Debug, Clone, Copy)]
struct Reg {
    index: usize,
    bytes: u32,
    /// `ah`, `bh`, `ch`, `dh`: bits 8-15.
    high: bool,
}

impl Reg {
    fn full(index: usize) -> Reg {
        Reg {
            index,
            bytes: 8,
            high: false,
        }
    }

    fn parse(name: &str) -> Option<Reg> {
        const LEGACY: [&str; 8] = ["ax", "cx", "dx", "bx", "sp", "bp", "si", "di"];
        let reg = |index, bytes| {
            Some(Reg {
                index,
                bytes,
                high: false,
            })
        };
        if let Some(i) = LEGACY.iter().position(|r| name == format!("r{r}")) {
            return reg(i, 8);
        }
        if let Some(i) = LEGACY.iter().position(|r| name == format!("e{r}")) {
            return reg(i, 4);
        }
        if let Some(i) = LEGACY.iter().position(|r| name == *r) {
            return reg(i, 2);
        }
        let low8 = ["al", "cl", "dl", "bl", "spl", "bpl", "sil", "dil"];
        if let Some(i) = low8.iter().position(|r| name == *r) {
            return reg(i, 1);
        }
        if let Some(i) = ["ah", "ch", "dh", "bh"].iter().position(|r| name == *r) {
            return Some(Reg {
                index: i,
                bytes: 1,
                high: true,
            });
        }
        let n = name.strip_prefix('r')?;
        let (digits, bytes) = match n.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
            None => (n, 8),
            Some((at, _)) => (
                &n[..at],
                match &n[at..] {
                    "d" => 4,
                    "w" => 2,
                    "b" => 1,
                    _ => return None,
                },
            ),
        };
        match digits.parse::<usize>() {
            Ok(i @ 8..=15) => reg(i, bytes),
            _ => None,
        }
    }
}

/// An operand: a register, an immediate, or memory (its address, computed, and size).
#[derive(Debug, Clone, Copy)]
enum Operand {
    Reg(Reg),
    Imm(u64),
    Mem { addr: u64, bytes: Option<u32> },
}

/// The arithmetic flags the conditional branches read.
#[derive(Debug, Default, Clone, Copy)]
struct Flags {
    zf: bool,
    cf: bool,
    sf: bool,
    of: bool,
}

struct Machine {
    regs: [u64; 16],
    flags: Flags,
    /// The thread pointer (`fs` base).
    fs: u64,
    /// Run-time address minus the executable's address.
    bias: u64,
    /// The stores of the walk, byte by byte: never written to the process.
    overlay: HashMap<u64, u8>,
    mem: File,
}

fn mask(bytes: u32) -> u64 {
    if bytes >= 8 {
        u64::MAX
    } else {
        (1u64 << (bytes * 8)) - 1
    }
}

fn sign(value: u64, bytes: u32) -> bool {
    value >> (bytes * 8 - 1) & 1 == 1
}

fn sign_extend(value: u64, bytes: u32) -> u64 {
    let shift = 64 - bytes * 8;
    (((value << shift) as i64) >> shift) as u64
}

fn split_mnemonic(text: &str) -> (&str, &str) {
    let text = text.split('#').next().unwrap_or(text).trim();
    match text.split_once(char::is_whitespace) {
        Some((m, rest)) => (m, rest.trim()),
        None => (text, ""),
    }
}

/// Splits operands at the commas outside brackets.
fn split_operands(operands: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut from) = (0, 0);
    for (i, c) in operands.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(operands[from..i].trim());
                from = i + 1;
            }
            _ => {}
        }
    }
    if !operands.trim().is_empty() {
        out.push(operands[from..].trim());
    }
    out
}

fn parse_number(text: &str) -> Option<u64> {
    let (neg, text) = match text.strip_prefix('-') {
        Some(t) => (true, t),
        None => (false, text),
    };
    let value = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok()?,
        None => text.parse().ok()?,
    };
    Some(if neg { value.wrapping_neg() } else { value })
}

impl Machine {
    fn new(bias: u64) -> Result<Machine, String> {
        let fs: u64;
        // SAFETY: on x86-64 Linux the word at `fs:0` is the thread control block's pointer to
        // itself (the thread pointer); reading it has no effect.
        unsafe { std::arch::asm!("mov {}, qword ptr fs:0", out(reg) fs) };
        let mut m = Machine {
            regs: [0; 16],
            flags: Flags::default(),
            fs,
            bias,
            overlay: HashMap::new(),
            mem: File::open("/proc/self/mem").map_err(|e| format!("/proc/self/mem: {e}"))?,
        };
        m.regs[4] = STACK_TOP; // rsp, with the return address on top
        m.store(STACK_TOP, 8, RETURN_TO)?;
        Ok(m)
    }

    fn get(&self, r: Reg) -> u64 {
        let v = self.regs[r.index];
        if r.high {
            (v >> 8) & 0xff
        } else {
            v & mask(r.bytes)
        }
    }

    fn set(&mut self, r: Reg, value: u64) {
        let old = self.regs[r.index];
        self.regs[r.index] = match (r.bytes, r.high) {
            (1, true) => (old & !0xff00) | ((value & 0xff) << 8),
            (8, _) => value,
            // A 32-bit write clears the upper half; narrower writes keep the rest.
            (4, _) => value & mask(4),
            (bytes, _) => (old & !mask(bytes)) | (value & mask(bytes)),
        };
    }

    fn in_stack(addr: u64) -> bool {
        (STACK_TOP - STACK_SIZE..STACK_TOP + 8).contains(&addr)
    }

    fn load(&self, addr: u64, bytes: u32) -> Result<u64, String> {
        let mut value = 0u64;
        for i in 0..bytes as u64 {
            let a = addr.wrapping_add(i);
            let byte = match self.overlay.get(&a) {
                Some(&b) => b,
                None if Self::in_stack(a) => {
                    return Err(format!("reads the stack at {a:x} before writing it"))
                }
                None => {
                    let mut b = [0u8];
                    self.mem
                        .read_exact_at(&mut b, a)
                        .map_err(|e| format!("reads {a:x}: {e}"))?;
                    b[0]
                }
            };
            value |= (byte as u64) << (8 * i);
        }
        Ok(value)
    }

    fn store(&mut self, addr: u64, bytes: u32, value: u64) -> Result<(), String> {
        for i in 0..bytes as u64 {
            self.overlay
                .insert(addr.wrapping_add(i), (value >> (8 * i)) as u8);
        }
        Ok(())
    }

    /// Parses an operand; `next` is the address of the next instruction (for `rip`).
    fn operand(&self, text: &str, next: Option<u64>) -> Result<Operand, String> {
        if let Some(r) = Reg::parse(text) {
            return Ok(Operand::Reg(r));
        }
        if let Some(v) = parse_number(text) {
            return Ok(Operand::Imm(v));
        }
        // Memory: [SIZE PTR ][fs:]([expr] | disp)
        let (bytes, rest) = match text.split_once(" PTR ") {
            Some((size, rest)) => (
                Some(match size {
                    "BYTE" => 1,
                    "WORD" => 2,
                    "DWORD" => 4,
                    "QWORD" => 8,
                    other => return Err(format!("operand size {other}")),
                }),
                rest,
            ),
            None => (None, text),
        };
        let (segment, rest) = match rest.strip_prefix("fs:") {
            Some(rest) => (self.fs, rest),
            None => (0, rest),
        };
        let addr = match rest.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            Some(expr) => self.address(expr, next)?,
            None => parse_number(rest).ok_or_else(|| format!("operand `{text}`"))?,
        };
        Ok(Operand::Mem {
            addr: segment.wrapping_add(addr),
            bytes,
        })
    }

    /// `base+index*scale+disp`, any part missing, `rip` relative to the next instruction.
    fn address(&self, expr: &str, next: Option<u64>) -> Result<u64, String> {
        let mut addr = 0u64;
        let mut rest = expr;
        let mut negative = false;
        loop {
            let end = rest.find(['+', '-']).unwrap_or(rest.len());
            let term = &rest[..end];
            let value = if term == "rip" {
                next.ok_or("rip at the end of the function")?
                    .wrapping_add(self.bias)
            } else if let Some((reg, scale)) = term.split_once('*') {
                let r = Reg::parse(reg).ok_or_else(|| format!("register `{reg}`"))?;
                self.get(r)
                    .wrapping_mul(parse_number(scale).ok_or("scale")?)
            } else if let Some(r) = Reg::parse(term) {
                self.get(r)
            } else {
                parse_number(term).ok_or_else(|| format!("address term `{term}`"))?
            };
            addr = if negative {
                addr.wrapping_sub(value)
            } else {
                addr.wrapping_add(value)
            };
            if end == rest.len() {
                return Ok(addr);
            }
            negative = rest[end..].starts_with('-');
            rest = &rest[end + 1..];
        }
    }

    fn read(&self, op: Operand, bytes: u32) -> Result<u64, String> {
        match op {
            Operand::Reg(r) => Ok(self.get(r)),
            Operand::Imm(v) => Ok(v & mask(bytes)),
            Operand::Mem { addr, .. } => self.load(addr, bytes),
        }
    }

    fn write(&mut self, op: Operand, bytes: u32, value: u64) -> Result<(), String> {
        match op {
            Operand::Reg(r) => {
                self.set(r, value);
                Ok(())
            }
            Operand::Imm(_) => Err("writes an immediate".into()),
            Operand::Mem { addr, .. } => self.store(addr, bytes, value & mask(bytes)),
        }
    }

    fn push(&mut self, value: u64) -> Result<(), String> {
        self.regs[4] = self.regs[4].wrapping_sub(8);
        self.store(self.regs[4], 8, value)
    }

    fn pop(&mut self) -> Result<u64, String> {
        let v = self.load(self.regs[4], 8)?;
        self.regs[4] = self.regs[4].wrapping_add(8);
        Ok(v)
    }

    /// The flags of `a - b` (what `cmp` and `sub` set).
    fn set_sub_flags(&mut self, a: u64, b: u64, bytes: u32) -> u64 {
        let r = a.wrapping_sub(b) & mask(bytes);
        self.flags = Flags {
            zf: r == 0,
            cf: a < b,
            sf: sign(r, bytes),
            of: sign((a ^ b) & (a ^ r), bytes),
        };
        r
    }

    fn set_add_flags(&mut self, a: u64, b: u64, bytes: u32) -> u64 {
        let r = a.wrapping_add(b) & mask(bytes);
        self.flags = Flags {
            zf: r == 0,
            cf: r < a,
            sf: sign(r, bytes),
            of: sign(!(a ^ b) & (a ^ r), bytes),
        };
        r
    }

    fn set_logic_flags(&mut self, r: u64, bytes: u32) {
        self.flags = Flags {
            zf: r == 0,
            cf: false,
            sf: sign(r, bytes),
            of: false,
        };
    }

    fn condition(&self, cc: &str) -> Option<bool> {
        let f = self.flags;
        Some(match cc {
            "e" | "z" => f.zf,
            "ne" | "nz" => !f.zf,
            "b" | "c" | "nae" => f.cf,
            "ae" | "nb" | "nc" => !f.cf,
            "be" | "na" => f.cf || f.zf,
            "a" | "nbe" => !f.cf && !f.zf,
            "s" => f.sf,
            "ns" => !f.sf,
            "l" | "nge" => f.sf != f.of,
            "ge" | "nl" => f.sf == f.of,
            "le" | "ng" => f.zf || f.sf != f.of,
            "g" | "nle" => !f.zf && f.sf == f.of,
            "o" => f.of,
            "no" => !f.of,
            _ => return None,
        })
    }

    /// A branch's target: `35c41 <probe+0x31>`, made run-time-free (the listing's address).
    fn target(operands: &str) -> Result<u64, String> {
        let addr = operands.split_whitespace().next().unwrap_or("");
        u64::from_str_radix(addr, 16)
            .map_err(|_| "an indirect jump (a tail call): not the uncontended path".to_string())
    }

    fn step(&mut self, insn: &Insn, next: Option<u64>) -> Result<Flow, String> {
        let (mnemonic, operands) = split_mnemonic(&insn.text);
        // `lock cmpxchg ...`: the prefix changes nothing for one thread; nor do the prefixes
        // of padding (`cs nop ...`, `data16 cs nop ...`, which a loop's alignment can put on
        // the path).
        let (mut mnemonic, mut operands) = (mnemonic, operands);
        while matches!(mnemonic, "lock" | "cs" | "ds" | "data16") {
            (mnemonic, operands) = split_mnemonic(operands);
        }
        let ops: Vec<Operand> = if mnemonic.starts_with('j') || matches!(mnemonic, "call" | "nop") {
            Vec::new()
        } else {
            split_operands(operands)
                .into_iter()
                .map(|o| self.operand(o, next))
                .collect::<Result<_, _>>()?
        };
        // The operation's size: a register operand's, else the memory operand's.
        let size = |ops: &[Operand]| -> Result<u32, String> {
            ops.iter()
                .find_map(|o| match o {
                    Operand::Reg(r) => Some(r.bytes),
                    _ => None,
                })
                .or_else(|| {
                    ops.iter().find_map(|o| match o {
                        Operand::Mem { bytes, .. } => *bytes,
                        _ => None,
                    })
                })
                .ok_or_else(|| "no operand size".to_string())
        };
        match (mnemonic, ops.as_slice()) {
            ("nop" | "endbr64", _) => {}
            ("push", [src]) => {
                let v = self.read(*src, 8)?;
                self.push(v)?;
            }
            ("pop", [dst]) => {
                let v = self.pop()?;
                self.write(*dst, 8, v)?;
            }
            ("ret", []) => {
                let to = self.pop()?;
                if to != RETURN_TO {
                    return Err(format!("returns to {to:x}, not to the caller"));
                }
                return Ok(Flow::Return);
            }
            ("mov" | "movabs", [dst, src]) => {
                let n = size(&ops)?;
                let v = self.read(*src, n)?;
                self.write(*dst, n, v)?;
            }
            ("movzx" | "movsx" | "movsxd", [Operand::Reg(dst), src]) => {
                let from = match src {
                    Operand::Reg(r) => r.bytes,
                    Operand::Mem { bytes: Some(b), .. } => *b,
                    _ => return Err("no source size".into()),
                };
                let v = self.read(*src, from)?;
                let v = if mnemonic == "movzx" {
                    v
                } else {
                    sign_extend(v, from)
                };
                self.set(*dst, v & mask(dst.bytes));
            }
            ("lea", [Operand::Reg(dst), Operand::Mem { addr, .. }]) => self.set(*dst, *addr),
            ("cmp" | "sub", [a, b]) => {
                let n = size(&ops)?;
                let (x, y) = (self.read(*a, n)?, self.read(*b, n)?);
                let r = self.set_sub_flags(x, y, n);
                if mnemonic == "sub" {
                    self.write(*a, n, r)?;
                }
            }
            ("add", [a, b]) => {
                let n = size(&ops)?;
                let (x, y) = (self.read(*a, n)?, self.read(*b, n)?);
                let r = self.set_add_flags(x, y, n);
                self.write(*a, n, r)?;
            }
            ("inc" | "dec", [a]) => {
                let n = size(&ops)?;
                let x = self.read(*a, n)?;
                let cf = self.flags.cf; // `inc` and `dec` leave the carry alone
                let r = if mnemonic == "inc" {
                    self.set_add_flags(x, 1, n)
                } else {
                    self.set_sub_flags(x, 1, n)
                };
                self.flags.cf = cf;
                self.write(*a, n, r)?;
            }
            ("test" | "and" | "or" | "xor", [a, b]) => {
                let n = size(&ops)?;
                let (x, y) = (self.read(*a, n)?, self.read(*b, n)?);
                let r = match mnemonic {
                    "test" | "and" => x & y,
                    "or" => x | y,
                    _ => x ^ y,
                };
                self.set_logic_flags(r, n);
                if mnemonic != "test" {
                    self.write(*a, n, r)?;
                }
            }
            ("shl" | "shr", [a, b]) => {
                let n = size(&ops)?;
                let (x, count) = (self.read(*a, n)?, self.read(*b, 1)? & 63);
                let r = if mnemonic == "shl" {
                    x.checked_shl(count as u32).unwrap_or(0)
                } else {
                    x >> count
                } & mask(n);
                if count != 0 {
                    self.set_logic_flags(r, n);
                }
                self.write(*a, n, r)?;
            }
            ("cmpxchg", [dst, Operand::Reg(src)]) => {
                let n = src.bytes;
                let acc = Reg {
                    index: 0,
                    bytes: n,
                    high: false,
                };
                let (old, expected) = (self.read(*dst, n)?, self.get(acc));
                self.set_sub_flags(expected, old, n);
                if old == expected {
                    let v = self.get(*src);
                    self.write(*dst, n, v)?;
                } else {
                    self.set(acc, old);
                }
            }
            ("xchg", [a, b]) => {
                let n = size(&ops)?;
                let (x, y) = (self.read(*a, n)?, self.read(*b, n)?);
                self.write(*a, n, y)?;
                self.write(*b, n, x)?;
            }
            ("jmp", []) => return Ok(Flow::Jump(Self::target(operands)?)),
            ("call", []) => {
                return Err("calls out: a slow path, not the uncontended path".into());
            }
            (j, []) if j.starts_with('j') => {
                let taken = self
                    .condition(&j[1..])
                    .ok_or_else(|| format!("the branch `{j}` is not modelled"))?;
                return Ok(if taken {
                    Flow::Jump(Self::target(operands)?)
                } else {
                    Flow::Next
                });
            }
            _ => return Err("an instruction the interpreter does not model".into()),
        }
        Ok(Flow::Next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_parse_with_their_sizes() {
        let r = |n| Reg::parse(n).map(|r| (r.index, r.bytes, r.high));
        assert_eq!(r("rax"), Some((0, 8, false)));
        assert_eq!(r("esi"), Some((6, 4, false)));
        assert_eq!(r("dil"), Some((7, 1, false)));
        assert_eq!(r("ah"), Some((0, 1, true)));
        assert_eq!(r("r13"), Some((13, 8, false)));
        assert_eq!(r("r12d"), Some((12, 4, false)));
        assert_eq!(r("r8b"), Some((8, 1, false)));
        assert_eq!(r("r16"), None);
        assert_eq!(r("rip"), None);
    }

    #[test]
    fn flags_decide_branches_as_the_cpu_does() {
        let mut m = Machine::new(0).unwrap();
        m.set_sub_flags(1, 2, 4); // 1 < 2
        assert_eq!(m.condition("b"), Some(true));
        assert_eq!(m.condition("l"), Some(true));
        assert_eq!(m.condition("e"), Some(false));
        m.set_sub_flags(0xffff_ffff, 1, 4); // -1 < 1 signed, above unsigned
        assert_eq!(m.condition("a"), Some(true));
        assert_eq!(m.condition("l"), Some(true));
        m.set_sub_flags(2, 2, 8);
        assert_eq!(m.condition("be"), Some(true));
        assert_eq!(m.condition("ne"), Some(false));
    }

    #[test]
    fn stores_stay_in_the_overlay() {
        let word = std::hint::black_box(Box::new(7u32));
        let addr = &*word as *const u32 as u64;
        let mut m = Machine::new(0).unwrap();
        assert_eq!(m.load(addr, 4).unwrap(), 7);
        m.store(addr, 4, 9).unwrap();
        assert_eq!(m.load(addr, 4).unwrap(), 9);
        assert_eq!(*word, 7, "the process's memory is untouched");
        m.set(Reg::full(1), addr);
        let op = m.operand("DWORD PTR [rcx+0x0]", None).unwrap();
        assert_eq!(m.read(op, 4).unwrap(), 9);
    }
}
