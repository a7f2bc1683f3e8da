//! No two files of `xtask/`, `device/` or `vmm/` import each other, even
//! through others: the files of each crate's `src/` and the references
//! between them form a graph without circles.
//!
//! Run it alone with `cargo test -p xtask --test import_circles`; a circle
//! fails it and is named, file by file. (`cargo xtask test` runs it with
//! the rest of the workspace's tests, and so does CI.)
//!
//! A file's module path comes from its place (`src/a/b.rs` and
//! `src/a/b/mod.rs` are `a::b`; `src/bin/` holds other crates and is left
//! out). A file refers to another when its code names a path into it:
//! `crate::a::b::X`, `super::X`, `self::b::X`, a child module `b::X`, a
//! module brought in by name (`use crate::a;` then `a::b::X`), and every
//! path of a braced group (`crate::a::{self, b::X}`); the path goes to the
//! longest module that is a file. A child naming its parent counts
//! like any other reference. Comments, strings and the `#[cfg(test)]`
//! module at the end of a file are left out: a test may use what it tests.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every `.rs` file under `src`, by module path.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let Ok(relative) = path.strip_prefix(src) else {
                continue;
            };
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let mut module: Module = relative
                .with_extension("")
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            if module.first().is_some_and(|m| m == "bin") {
                continue;
            }
            if module
                .last()
                .is_some_and(|m| ["mod", "lib", "main"].contains(&m.as_str()))
            {
                module.pop();
            }
            found.insert(module, path);
        }
    }
    found
}

/// The code of a file that counts: all but the `#[cfg(test)]` module at
/// its end (private, or `pub(crate)` where another file's tests run its
/// tests).
fn code(text: &str) -> &str {
    let test_module = ["#[cfg(test)]\nmod ", "#[cfg(test)]\npub(crate) mod "]
        .iter()
        .filter_map(|m| text.find(m))
        .min();
    match test_module {
        Some(at) => &text[..at],
        None => text,
    }
}

#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    Colons,
    Open,
    Close,
    Comma,
    Other,
}

/// The tokens a path is made of; comments, strings and characters are
/// skipped (`"a::b"` in a message is no path).
fn tokens(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && at(i + 1) == '*' {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && at(i + 1) == '/') {
                i += 1;
            }
            i += 2;
            continue;
        }
        if c == 'r'
            && (at(i + 1) == '"' || (at(i + 1) == '#' && (at(i + 2) == '"' || at(i + 2) == '#')))
            && (i == 0 || !(at(i - 1).is_alphanumeric() || at(i - 1) == '_'))
        {
            // A raw string: r"…", r#"…"#.
            let mut hashes = 0;
            i += 1;
            while at(i) == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            let end: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            while i < chars.len() && !chars[i..].starts_with(&end.chars().collect::<Vec<_>>()) {
                i += 1;
            }
            i += end.len();
            out.push(Token::Other);
            continue;
        }
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
            continue;
        }
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            out.push(Token::Other);
        } else if c == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A character ('"', '\''); a lifetime ('a) has no closing quote.
            i += if at(i + 1) == '\\' { 2 } else { 1 };
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            out.push(Token::Other);
        } else if c == ':' && at(i + 1) == ':' {
            out.push(Token::Colons);
            i += 1;
        } else if c == '{' {
            out.push(Token::Open);
        } else if c == '}' {
            out.push(Token::Close);
        } else if c == ',' {
            out.push(Token::Comma);
        } else if !c.is_whitespace() {
            out.push(Token::Other);
        }
        i += 1;
    }
    out
}

/// The paths that start at `tokens[at]`: `a::b::c`, or `a::{b, c::{self, d}}`
/// as `a::b`, `a::c`, `a::c::d`. Returns them and where parsing stopped.
/// `nested`: inside a group, where `self` is the group's own prefix.
fn paths_at(tokens: &[Token], mut at: usize, nested: bool) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        match tokens.get(at) {
            Some(Token::Ident(name)) if name != "as" => {
                if !(nested && prefix.is_empty() && name == "self") {
                    prefix.push(name.clone());
                }
                at += 1;
            }
            Some(Token::Open) => {
                let mut all = Vec::new();
                at += 1;
                while !matches!(tokens.get(at), Some(Token::Close) | None) {
                    if matches!(tokens.get(at), Some(Token::Comma)) {
                        at += 1;
                        continue;
                    }
                    let (inner, next) = paths_at(tokens, at, true);
                    all.extend(
                        inner
                            .into_iter()
                            .map(|tail| [prefix.clone(), tail].concat()),
                    );
                    // Skip what ends an item (`X as Y`, a `*`).
                    at = next.max(at + 1);
                    while !matches!(tokens.get(at), Some(Token::Comma | Token::Close) | None) {
                        at += 1;
                    }
                }
                return (all, at + 1);
            }
            _ => return (vec![prefix], at),
        }
        if tokens.get(at) == Some(&Token::Colons) {
            at += 1;
        } else {
            return (vec![prefix], at);
        }
    }
}

/// Every path in `tokens` that starts a path (`a::…`, not the `b` of
/// `a::b`), with its braced groups spread out.
fn all_paths(tokens: &[Token]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < tokens.len() {
        let starts_path = matches!(&tokens[at], Token::Ident(_))
            && tokens.get(at + 1) == Some(&Token::Colons)
            && (at == 0 || tokens[at - 1] != Token::Colons);
        if !starts_path {
            at += 1;
            continue;
        }
        let (paths, next) = paths_at(tokens, at, false);
        out.extend(paths);
        at = next.max(at + 1);
    }
    out
}

/// The files `module`'s code refers to (itself left out). A path from
/// `crate`, `super` or `self` that ends at a module file also names it: its
/// last segment, used as a path's first (`use crate::a::{self, b}`, then
/// `a::x::f()` and `b::g()`), goes where it points.
fn references(module: &Module, code: &str, files: &BTreeMap<Module, PathBuf>) -> BTreeSet<Module> {
    let anchored = |path: &[String]| -> Option<Module> {
        match path.first().map(String::as_str) {
            Some("crate") => Some(path[1..].to_vec()),
            Some("super") => {
                let supers = path.iter().take_while(|s| *s == "super").count();
                let keep = module.len().saturating_sub(supers);
                Some([&module[..keep], &path[supers..]].concat())
            }
            Some("self") => Some([module.as_slice(), &path[1..]].concat()),
            _ => None,
        }
    };
    let paths = all_paths(&tokens(code));
    // Names brought in for modules, and each file's own child modules.
    let mut names: BTreeMap<String, Module> = BTreeMap::new();
    for child in files
        .keys()
        .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
    {
        names.insert(child[module.len()].clone(), child.clone());
    }
    for path in &paths {
        if let Some(target) = anchored(path).filter(|m| files.contains_key(m) && !m.is_empty()) {
            names.insert(target.last().expect("not the root").clone(), target);
        }
    }
    let mut out = BTreeSet::new();
    for path in &paths {
        let absolute = match anchored(path) {
            Some(absolute) => absolute,
            None => match names.get(&path[0]) {
                Some(target) => [target.as_slice(), &path[1..]].concat(),
                None => continue,
            },
        };
        if let Some(target) = (0..=absolute.len())
            .rev()
            .map(|n| absolute[..n].to_vec())
            .find(|m| files.contains_key(m))
        {
            if target != *module {
                out.insert(target);
            }
        }
    }
    out
}

/// The graph of `src`'s files.
fn graph(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let files = modules(src);
    files
        .iter()
        .map(|(module, path)| {
            let text = fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            (module.clone(), references(module, code(&text), &files))
        })
        .collect()
}

/// The circles of `graph`: its strongly connected parts of two or more
/// files (Tarjan's algorithm), each sorted.
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'g Module, usize>,
        low: BTreeMap<&'g Module, usize>,
        stack: Vec<&'g Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in &self.graph[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut part = Vec::new();
                while let Some(w) = self.stack.pop() {
                    part.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if part.len() > 1 {
                    part.sort();
                    self.found.push(part);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found.sort();
    walk.found
}

fn names(circle: &[Module]) -> String {
    circle
        .iter()
        .map(|m| {
            if m.is_empty() {
                "(root)".to_string()
            } else {
                m.join("::")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent folder")
        .to_path_buf()
}

#[test]
fn no_file_imports_another_that_imports_it_back() {
    let mut report = Vec::new();
    for crate_src in ["xtask/src", "device/src", "vmm/src"] {
        let graph = graph(&workspace().join(crate_src));
        assert!(
            graph.len() > 5,
            "{crate_src}: only {} files found",
            graph.len()
        );
        for circle in circles(&graph) {
            report.push(format!(
                "{crate_src}: circle of {}: {}",
                circle.len(),
                names(&circle)
            ));
        }
    }
    assert!(
        report.is_empty(),
        "files that import each other (directly or through others):\n{}",
        report.join("\n")
    );
}

#[test]
fn a_planted_circle_is_found_and_named() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/planted_circle");
    let graph = graph(&fixture);
    let found: Vec<String> = circles(&graph).iter().map(|c| names(c)).collect();
    // a → b (crate::, braced), b → c (super::, braced self), c → a (a
    // use in a block); p ↔ p::q (a child module by its own name, and
    // super:: back). `clean` refers to a only from its test module and a
    // comment, and `quoted` only in a string.
    assert_eq!(found, ["a, b, c", "p, p::q"], "the graph: {graph:?}");
    assert_eq!(
        graph[&vec!["clean".to_string()]],
        BTreeSet::from([vec!["a".to_string()]])
    );
    assert!(graph[&vec!["quoted".to_string()]].is_empty(), "{graph:?}");
}

#[test]
fn paths_are_read_with_their_braced_groups() {
    let t = tokens("crate::a::{self, b::{C, d}, e as f, *};");
    let (paths, _) = paths_at(&t, 0, false);
    let joined: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        joined,
        [
            "crate::a",
            "crate::a::b::C",
            "crate::a::b::d",
            "crate::a::e",
            "crate::a"
        ]
    );
}
