//! Each crate is a room of its concern's size, and each function fits on a screen: no shipped
//! crate holds more than 15 % of the shipped lines, and no shipped function is longer than 60
//! lines but the guest programs' assemblers and the few listed, with their reasons, in
//! docs/architecture.md ("Functions longer than 60 lines").
//!
//! The counting rule, which docs/architecture.md states: shipped code is every product crate's
//! `src` (every crate but the bench and the test kit), the files its crate roots reach through
//! `mod` declarations that are not `#[cfg(test)]`; each file counts every line, comments and blank
//! lines included, less the lines of its `#[cfg(test)]` items. A function's length runs from its
//! signature to its closing brace.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

mod common;
use common::{packages, workspace_root};
use syn::spanned::Spanned;
use syn::visit::Visit;

/// The largest share of the shipped lines one crate may hold, in percent.
const SHARE_BAR: f64 = 15.0;

/// The longest a shipped function may be, in lines, unless exempt.
const LONGEST: usize = 60;

/// The crates that only measure or test: not shipped.
const DEVELOPMENT: [&str; 2] = ["hvstats-bench", "hvstats-testkit"];

/// The crate whose functions are guest programs' assemblers, exempt from [`LONGEST`]: a program
/// reads best as one listing.
const ASSEMBLERS: &str = "hvstats-guest";

/// The most functions docs/architecture.md may exempt besides the assemblers.
const MOST_EXEMPT: usize = 5;

/// Each shipped crate's name and `src` directory.
fn shipped_crates() -> Vec<(String, PathBuf)> {
    let mut crates: Vec<(String, PathBuf)> = packages()
        .iter()
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap());
            (p["name"].as_str().unwrap().to_owned(), manifest.parent().unwrap().join("src"))
        })
        .filter(|(name, _)| !DEVELOPMENT.contains(&name.as_str()))
        .collect();
    crates.sort();
    crates
}

/// Whether `attrs` make an item test-only: `#[cfg(test)]`, `#[cfg(all(test, …))]` or `#[test]`.
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if attr.path().is_ident("test") {
            return true;
        }
        if !attr.path().is_ident("cfg") {
            return false;
        }
        let Ok(list) = attr.meta.require_list() else { return false };
        let tokens = list.tokens.to_string();
        tokens == "test" || (tokens.starts_with("all") && tokens.contains("test") && !tokens.contains("not"))
    })
}

/// One shipped source file: where it is, its lines and its syntax.
struct SourceFile {
    path: PathBuf,
    lines: usize,
    syntax: syn::File,
}

fn parse(path: &Path) -> SourceFile {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let syntax = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    SourceFile { path: path.to_owned(), lines: text.lines().count(), syntax }
}

/// The file a `mod name;` declared in `file` (inline modules `inline` deep) is in.
fn module_file(file: &Path, inline: &[String], item: &syn::ItemMod) -> Option<PathBuf> {
    let dir = file.parent().unwrap();
    let stem = file.file_stem().unwrap().to_string_lossy();
    for attr in &item.attrs {
        if attr.path().is_ident("path")
            && let syn::Meta::NameValue(nv) = &attr.meta
            && let syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) = &nv.value
        {
            return Some(dir.join(s.value()));
        }
    }
    let mut base =
        if matches!(stem.as_ref(), "mod" | "lib" | "main") { dir.to_owned() } else { dir.join(&*stem) };
    for name in inline {
        base.push(name);
    }
    let name = item.ident.to_string();
    [base.join(format!("{name}.rs")), base.join(&name).join("mod.rs")].into_iter().find(|p| p.is_file())
}

/// The files a crate ships: its roots and every file they reach through `mod` declarations that
/// are not test-only.
fn shipped_files(src: &Path) -> Vec<SourceFile> {
    let mut roots: Vec<PathBuf> =
        ["lib.rs", "main.rs"].iter().map(|r| src.join(r)).filter(|p| p.is_file()).collect();
    if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
        roots.extend(bins.map(|b| b.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "rs")));
    }
    let mut files = Vec::new();
    while let Some(path) = roots.pop() {
        let file = parse(&path);
        collect_modules(&path, &[], &file.syntax.items, &mut roots);
        files.push(file);
    }
    files
}

fn collect_modules(file: &Path, inline: &[String], items: &[syn::Item], found: &mut Vec<PathBuf>) {
    for item in items {
        let syn::Item::Mod(module) = item else { continue };
        if test_only(&module.attrs) {
            continue;
        }
        match &module.content {
            Some((_, inner)) => {
                let mut deeper = inline.to_vec();
                deeper.push(module.ident.to_string());
                collect_modules(file, &deeper, inner, found);
            }
            None => {
                let path = module_file(file, inline, module)
                    .unwrap_or_else(|| panic!("{}: no file for `mod {}`", file.display(), module.ident));
                found.push(path);
            }
        }
    }
}

/// The lines of a span, first to last, both included.
fn span_lines(span: proc_macro2::Span) -> usize {
    span.end().line + 1 - span.start().line
}

/// Walks a file's shipped items: counts the lines of its test-only items and measures every
/// function.
#[derive(Default)]
struct Walk {
    test_lines: usize,
    /// Each function's name, first line and length.
    functions: Vec<(String, usize, usize)>,
}

impl Walk {
    fn function(&mut self, name: &syn::Ident, sig: &syn::Signature, body: &syn::Block) {
        let start = sig.span().start().line;
        let end = body.brace_token.span.close().end().line;
        self.functions.push((name.to_string(), start, end + 1 - start));
    }
}

impl<'ast> Visit<'ast> for Walk {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            _ => {
                syn::visit::visit_item(self, item);
                return;
            }
        };
        if test_only(attrs) {
            self.test_lines += span_lines(item.span());
        } else {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        if let syn::ImplItem::Fn(f) = item
            && test_only(&f.attrs)
        {
            self.test_lines += span_lines(item.span());
            return;
        }
        syn::visit::visit_impl_item(self, item);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.function(&f.sig.ident, &f.sig, &f.block);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.function(&f.sig.ident, &f.sig, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.function(&f.sig.ident, &f.sig, body);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// One shipped crate, measured: its shipped lines and every function with its file, name, first
/// line and length.
struct Measured {
    name: String,
    lines: usize,
    functions: Vec<(String, String, usize, usize)>,
}

fn measure() -> Vec<Measured> {
    let root = workspace_root();
    shipped_crates()
        .into_iter()
        .map(|(name, src)| {
            let (mut lines, mut functions) = (0, Vec::new());
            for file in shipped_files(&src) {
                let mut walk = Walk::default();
                walk.visit_file(&file.syntax);
                lines += file.lines - walk.test_lines;
                let rel = file.path.strip_prefix(&root).unwrap().display().to_string();
                functions.extend(walk.functions.into_iter().map(|(f, at, len)| (rel.clone(), f, at, len)));
            }
            Measured { name, lines, functions }
        })
        .collect()
}

#[test]
fn no_shipped_crate_holds_more_than_its_share_of_the_shipped_lines() {
    let crates = measure();
    let total: usize = crates.iter().map(|c| c.lines).sum();
    assert!(total > 20_000, "{total} shipped lines: not the workspace?");
    let mut table = String::from("crate                  lines  share\n");
    let mut over = Vec::new();
    for krate in &crates {
        let share = 100.0 * krate.lines as f64 / total as f64;
        table.push_str(&format!("{:<20} {:>7} {:>5.1} %\n", krate.name, krate.lines, share));
        if share > SHARE_BAR {
            over.push(format!("{} holds {share:.1} % of the shipped lines", krate.name));
        }
    }
    table.push_str(&format!("{:<20} {total:>7}\n", "shipped"));
    println!("{table}");
    assert!(over.is_empty(), "over {SHARE_BAR} %: {over:#?}\n{table}");
}

/// The exemptions docs/architecture.md lists: (file, function) from the rows of its table under
/// "Functions longer than 60 lines".
fn listed_exemptions() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(workspace_root().join("docs/architecture.md")).unwrap();
    let section = doc
        .split("\n## ")
        .chain(doc.split("\n### "))
        .find(|s| s.starts_with("Functions longer than 60 lines"))
        .expect("docs/architecture.md has no section \"Functions longer than 60 lines\"");
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(|c| c.trim().trim_matches('`')).collect();
            (cells[1].to_owned(), cells[2].to_owned())
        })
        .collect()
}

#[test]
fn no_shipped_function_is_longer_than_sixty_lines_but_the_listed_ones() {
    let exempt = listed_exemptions();
    assert!(
        exempt.len() <= MOST_EXEMPT,
        "{} exemptions listed, at most {MOST_EXEMPT}: {exempt:#?}",
        exempt.len()
    );
    let crates = measure();
    let (mut long, mut measured) = (Vec::new(), 0);
    for krate in crates.iter().filter(|c| c.name != ASSEMBLERS) {
        for (file, function, at, len) in &krate.functions {
            measured += 1;
            if *len > LONGEST && !exempt.iter().any(|(f, n)| f == file && n == function) {
                long.push(format!("{file}:{at} {function}: {len} lines"));
            }
        }
    }
    assert!(measured > 1_000, "{measured} functions: not the workspace?");
    for (file, function) in &exempt {
        let found = crates.iter().flat_map(|c| &c.functions).find(|(f, n, _, _)| f == file && n == function);
        let (_, _, _, len) =
            found.unwrap_or_else(|| panic!("listed {file} {function} is not a shipped function"));
        assert!(*len > LONGEST, "listed {file} {function} is {len} lines: take it off the list");
    }
    assert!(long.is_empty(), "{} functions over {LONGEST} lines: {long:#?}", long.len());
}
