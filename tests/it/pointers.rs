//! The docs point only at what exists: every file path the book, the README and
//! ARCHITECTURE.md name, every file the architecture page's layout table lists under a folder,
//! and every `module::Item` path of the crate they name.

use crate::common::assert_none_found;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The pages read: the README, ARCHITECTURE.md and the book (the CHANGELOG names what was,
/// and is left out).
fn pages() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string(), "ARCHITECTURE.md".to_string()];
    let mut book: Vec<String> = std::fs::read_dir(repo("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| format!("docs/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    book.sort();
    names.extend(book);
    names
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(repo(&name)).expect("a page");
            (name, text)
        })
        .collect()
}

/// What stands between backticks in `text`.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The folders of the repository a path may start with.
const ROOTS: &[&str] = &[
    "src/",
    "tests/",
    "scripts/",
    "bench/",
    "packaging/",
    "docker/",
    "grafana/",
    "config/",
    "schema/",
    "producers/",
    "docs/",
    ".config/",
    ".github/",
    ".ci/",
];

/// A path of the repository named in `token` (`src/worker/`, `tests/it/model/`), if it is one.
fn path_in(token: &str) -> Option<&str> {
    let token = token.trim();
    if token.contains(' ') || token.contains('*') || token.contains('<') {
        return None;
    }
    ROOTS
        .iter()
        .any(|root| token.starts_with(root))
        .then_some(token)
}

#[test]
fn every_path_the_docs_name_exists() {
    let mut missing = Vec::new();
    for (page, text) in pages() {
        for token in quoted(&text) {
            // `producers/node_modules` is made by `npm ci`, not kept.
            let Some(path) = path_in(token).filter(|p| !p.contains("node_modules")) else {
                continue;
            };
            let path = path.split(':').next().unwrap_or(path);
            if !repo(path).exists() {
                missing.push(format!("{page}: `{token}`"));
            }
        }
    }
    assert_none_found("paths that do not exist", &missing);
}

/// Every file below `dir`, as paths relative to it.
fn files_below(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                out.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
    out
}

#[test]
fn every_file_of_the_layout_table_exists() {
    let page = std::fs::read_to_string(repo("docs/architecture.md")).expect("the page");
    let start = page.find("## Layout").expect("the layout section");
    let mut missing = Vec::new();
    for row in page[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| path"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = row.split(" | ").collect();
        let folders: Vec<&str> = quoted(cells[0])
            .into_iter()
            .filter(|p| p.ends_with('/'))
            .collect();
        if folders.is_empty() {
            continue;
        }
        let known: BTreeSet<String> = folders.iter().flat_map(|f| files_below(&repo(f))).collect();
        for token in quoted(cells[1..].join(" | ").as_str()) {
            let bare = !token.contains(' ') && !token.starts_with('.') && !token.contains("::");
            let file = [".rs", ".lua", ".js", ".html", ".sh", ".py"]
                .iter()
                .any(|ext| token.ends_with(ext));
            if !bare || !file || path_in(token).is_some() {
                continue;
            }
            if !known
                .iter()
                .any(|k| k == token || k.ends_with(&format!("/{token}")))
            {
                missing.push(format!("{}: `{token}`", folders.join(", ")));
            }
        }
    }
    assert_none_found(
        "files the layout table lists that are not in their folder",
        &missing,
    );
}

/// The crate's top-level modules, as `src/lib.rs` declares them.
fn top_modules() -> BTreeSet<String> {
    let lib = std::fs::read_to_string(repo("src/lib.rs")).expect("lib.rs");
    lib.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l
                .strip_prefix("pub ")
                .or_else(|| l.strip_prefix("pub(crate) "));
            let rest = rest.unwrap_or(l).strip_prefix("mod ")?;
            Some(rest.trim_end_matches(';').to_string())
        })
        .collect()
}

/// The source of module `segments` (`["redis", "store"]`): `src/redis/store.rs` and every
/// file of `src/redis/store/` but its submodules' folders, if it is a module.
fn module_source(segments: &[&str]) -> Option<String> {
    let base = format!("src/{}", segments.join("/"));
    let file = repo(&format!("{base}.rs"));
    let dir = repo(&base);
    if !file.exists() && !dir.is_dir() {
        return None;
    }
    // The module's own file and, beside it, its folder's files (`src/m.rs` and `src/m/`).
    let mut text = std::fs::read_to_string(file).unwrap_or_default();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "rs") {
            text.push_str(&std::fs::read_to_string(path).unwrap_or_default());
        }
    }
    Some(text)
}

/// Whether `source` defines or re-exports `name`: an item, a `use` of it, an enum variant or
/// a field (a line that starts with it).
fn defines(source: &str, name: &str) -> bool {
    let kinds = [
        "fn ",
        "struct ",
        "enum ",
        "trait ",
        "type ",
        "const ",
        "static ",
        "mod ",
        "macro_rules! ",
    ];
    let whole = |rest: &str| {
        rest.chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    };
    source.lines().any(|line| {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix(name) {
            if whole(rest) && rest.starts_with(['(', '{', ',', ':', ' ']) {
                return true;
            }
        }
        line.match_indices(name).any(|(at, _)| {
            let before = &line[..at];
            whole(&line[at + name.len()..])
                && (kinds.iter().any(|k| before.ends_with(k))
                    || line.contains("use ") && before.ends_with(['{', ':', ' ']))
        })
    })
}

#[test]
fn every_module_path_the_docs_name_exists() {
    let top = top_modules();
    let all = files_text(&repo("src"));
    let mut missing = Vec::new();
    for (page, text) in pages() {
        for token in quoted(&text) {
            let token = token.trim_end_matches("()");
            let segments: Vec<&str> = token.split("::").collect();
            if segments.len() < 2
                || !top.contains(segments[0])
                || segments
                    .iter()
                    .any(|s| s.is_empty() || !s.chars().all(|c| c.is_alphanumeric() || c == '_'))
            {
                continue;
            }
            // The longest prefix that is a module, then the item it names.
            let mut depth = segments.len();
            let source = loop {
                if let Some(source) = module_source(&segments[..depth]) {
                    break Some(source);
                }
                depth -= 1;
                if depth == 0 {
                    break None;
                }
            };
            let ok = match (source, segments.get(depth)) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(source), Some(item)) => {
                    defines(&source, item)
                        && segments[depth + 1..]
                            .iter()
                            .all(|member| defines(&all, member))
                }
            };
            if !ok {
                missing.push(format!("{page}: `{token}`"));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert_none_found("module paths that name nothing", &missing);
}

/// Every Rust file below `dir`, concatenated.
fn files_text(dir: &Path) -> String {
    files_below(dir)
        .into_iter()
        .filter(|f| f.ends_with(".rs"))
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap_or_default())
        .collect()
}
