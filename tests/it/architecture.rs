//! The architecture page's "may use" table holds: every `crate::` path in a module's source
//! names itself or a module its row allows, and every module of the library has a row.

use crate::common::assert_none_found;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Folders whose modules have rows of their own (`redis::store`), not one for the folder.
const SIDES: &[&str] = &["redis"];

/// The module a path names: its first segment (`trigger::Shard::wake` is `trigger`), or its
/// first two in a side's folder (`redis::store::Store` is `redis::store`).
fn module_of(path: &str) -> String {
    let mut segments = path.split("::");
    let first = segments.next().unwrap_or_default();
    match segments.next() {
        Some(second) if !second.is_empty() && SIDES.contains(&first) => {
            format!("{first}::{second}")
        }
        _ => first.to_string(),
    }
}

/// The modules named in backticks of `cell` ([`module_of`]), leaving out what stands in
/// parentheses (submodules, notes).
fn names(cell: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut parts = cell.split('`');
    let mut outside = true;
    let mut text = parts.next().unwrap_or_default();
    loop {
        if outside {
            depth += text.matches('(').count() as i32 - text.matches(')').count() as i32;
        } else if depth == 0 {
            out.push(module_of(text));
        }
        match parts.next() {
            Some(next) => {
                text = next;
                outside = !outside;
            }
            None => return out,
        }
    }
}

/// Each module of the table and the modules it may use ("everything below" expanded).
fn table() -> BTreeMap<String, BTreeSet<String>> {
    rows()
        .into_iter()
        .map(|(module, _, allowed)| (module, allowed))
        .collect()
}

/// Each module of the table with its row's position and the modules it may use.
fn rows() -> Vec<(String, usize, BTreeSet<String>)> {
    let page = std::fs::read_to_string(repo("docs/architecture.md")).expect("the page");
    let start = page
        .find("## Modules and what they may touch")
        .expect("the modules section");
    let rows: Vec<(Vec<String>, String)> = page[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| module"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            (names(cells[0]), cells.last().unwrap_or(&"").to_string())
        })
        .collect();
    let mut out = Vec::new();
    for (i, (modules, may)) in rows.iter().enumerate() {
        let allowed: BTreeSet<String> = if may.contains("everything below") {
            rows[i + 1..].iter().flat_map(|(m, _)| m.clone()).collect()
        } else {
            names(may).into_iter().collect()
        };
        for m in modules {
            // Modules of one row may use each other.
            let mut allowed = allowed.clone();
            allowed.extend(modules.iter().cloned());
            out.push((m.clone(), i, allowed));
        }
    }
    out
}

/// The Rust files of a module: `src/M.rs` and everything under `src/M/` (`redis::store` is
/// `src/redis/store`).
fn files(module: &str) -> Vec<PathBuf> {
    let module = module.replace("::", "/");
    let mut out = Vec::new();
    let file = repo(&format!("src/{module}.rs"));
    if file.exists() {
        out.push(file);
    }
    let mut dirs = vec![repo(&format!("src/{module}"))];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

/// The modules `crate::` paths name in `source` ([`module_of`]; `use crate::{a, b::c}` too).
fn used(source: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in source.match_indices("crate::") {
        let rest = &source[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                out.insert(module_of(item.trim()));
            }
        } else {
            let path: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.insert(module_of(&path));
        }
    }
    out.retain(|n| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c == ':')
    });
    out
}

/// The modules `file` declares.
fn declared(file: &str) -> Vec<String> {
    let source = std::fs::read_to_string(repo(file)).expect("source");
    source
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let decl = l.strip_prefix("pub ").unwrap_or(l);
            let decl = decl.strip_prefix("pub(crate) ").unwrap_or(decl);
            decl.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(str::to_string)
        })
        .collect()
}

/// The modules of the library: those `src/lib.rs` declares, a side's folder by its modules.
fn library_modules() -> Vec<String> {
    let mut out = Vec::new();
    for module in declared("src/lib.rs") {
        if SIDES.contains(&module.as_str()) {
            let inner = declared(&format!("src/{module}.rs"));
            out.extend(inner.into_iter().map(|m| format!("{module}::{m}")));
        } else {
            out.push(module);
        }
    }
    out
}

#[test]
fn every_module_uses_only_what_the_architecture_page_allows() {
    let table = table();
    let mut wrong = Vec::new();
    for module in library_modules() {
        let Some(allowed) = table.get(&module) else {
            wrong.push(format!("`{module}` has no row in the table"));
            continue;
        };
        for file in files(&module) {
            let source = std::fs::read_to_string(&file).expect("source");
            for other in used(&source) {
                if other != module && !allowed.contains(&other) {
                    let at = file.strip_prefix(repo("")).unwrap_or(&file).display();
                    wrong.push(format!("{at} uses `{other}`, not in `{module}`'s row"));
                }
            }
        }
    }
    assert_none_found("docs/architecture.md's table and the code disagree", &wrong);
}

#[test]
fn every_row_allows_only_rows_below_it() {
    let rows = rows();
    let position: BTreeMap<&str, usize> = rows.iter().map(|(m, i, _)| (m.as_str(), *i)).collect();
    let mut wrong = Vec::new();
    for (module, i, allowed) in &rows {
        for other in allowed {
            match position.get(other.as_str()) {
                Some(j) if j >= i => {}
                Some(_) => wrong.push(format!("`{module}` may use `{other}`, a row above it")),
                None => wrong.push(format!("`{module}` may use `{other}`, which has no row")),
            }
        }
    }
    assert_none_found("docs/architecture.md's table runs back up", &wrong);
}

/// Modules that ask the running trigger only through its face: the items `src/trigger.rs`
/// re-exports, never one of its files.
const ASKERS: &[&str] = &["housekeeping", "ingress", "admin"];

/// What `file` re-exports (`pub(crate) use a::{B, C};`, `pub use d::E as F;`): its face.
fn reexports(file: &str) -> BTreeSet<String> {
    let source = std::fs::read_to_string(repo(file)).expect("source");
    let mut out = BTreeSet::new();
    for line in source.lines() {
        let line = line.trim();
        let Some(path) = ["pub(crate) use ", "pub use "]
            .iter()
            .find_map(|p| line.strip_prefix(p))
        else {
            continue;
        };
        let path = path.trim_end_matches(';');
        let items = match path.find('{') {
            Some(i) => path[i + 1..].trim_end_matches('}').split(',').collect(),
            None => vec![path.rsplit("::").next().unwrap_or(path)],
        };
        for item in items {
            let name = item.rsplit(" as ").next().unwrap_or(item).trim();
            if !name.is_empty() {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// The first segment of each path into `module` in `source` (`crate::trigger::Shard` and
/// `trigger::Shard` give `Shard`, `crate::trigger::{wake::Woken, Shard}` gives `wake` and
/// `Shard`); a path into a same-named module of another (`metrics::trigger::`) is not one.
fn items_of(module: &str, source: &str) -> BTreeSet<String> {
    let prefix = format!("{module}::");
    let mut out = BTreeSet::new();
    for (i, _) in source.match_indices(&prefix) {
        let before = &source[..i];
        let bare = !before.ends_with(|c: char| c == ':' || c == '_' || c.is_ascii_alphanumeric());
        if !bare && !before.ends_with("crate::") {
            continue;
        }
        let rest = &source[i + prefix.len()..];
        let segment = |s: &str| -> String {
            s.trim()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        match rest.strip_prefix('{') {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                out.extend(group.split(',').map(segment).filter(|s| !s.is_empty()));
            }
            None => {
                out.insert(segment(rest));
            }
        }
    }
    out.remove("self");
    out
}

#[test]
fn housekeeping_ingress_and_admin_ask_the_running_trigger_through_its_face() {
    let face = reexports("src/trigger.rs");
    assert!(face.contains("Shard") && face.contains("State"), "{face:?}");
    let mut wrong = Vec::new();
    for module in ASKERS {
        for file in files(module) {
            let source = std::fs::read_to_string(&file).expect("source");
            for item in items_of("trigger", &source) {
                if !face.contains(&item) {
                    let at = file.strip_prefix(repo("")).unwrap_or(&file).display();
                    wrong.push(format!("{at} uses `trigger::{item}`"));
                }
            }
        }
    }
    let what = format!("only what src/trigger.rs re-exports ({face:?}) is theirs to use");
    assert_none_found(&what, &wrong);
}

#[test]
fn the_table_is_read_as_written() {
    let table = table();
    assert!(table["cli"].contains("worker"), "everything below");
    let only_itself: BTreeSet<String> = ["redis::scripts".to_string()].into();
    assert_eq!(table["redis::scripts"], only_itself, "nothing of ours");
    assert!(
        table["keys"].contains("wire"),
        "a row's modules use each other"
    );
    assert!(
        table["housekeeping"].contains("worker"),
        "a path's first segment"
    );
    assert!(
        table["redis::notify"].contains("redis::conn"),
        "a side's modules by two segments"
    );
    assert!(!table["sink"].contains("amqp"), "parentheses are notes");
    assert!(table["ingress"].contains("trigger"));
    let inner = "use crate::trigger::{Shard, wake::Woken};\nlet s = trigger::shard::Shard::new();\nuse crate::metrics::trigger::X;";
    assert_eq!(
        items_of("trigger", inner),
        ["Shard", "shard", "wake"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    assert_eq!(
        used("use crate::a::B;\nuse crate::{b, c::d};\nlet x = crate::e::f();\nuse crate::redis::store::S;"),
        ["a", "b", "c", "e", "redis::store"].map(String::from).into_iter().collect()
    );
}

/// Only a sink makes the proof that deletes a member: `Confirmed::by_broker` is called under
/// `src/sink/` and nowhere else (its definition in `src/proof.rs` aside).
#[test]
fn only_the_sinks_make_a_confirmation() {
    let mut wrong = Vec::new();
    for module in library_modules() {
        for file in files(&module) {
            let source = std::fs::read_to_string(&file).expect("source");
            let at = file
                .strip_prefix(repo(""))
                .unwrap_or(&file)
                .display()
                .to_string();
            let maker = at.starts_with("src/sink/") || at == "src/proof.rs";
            if !maker && source.contains("Confirmed::by_broker") {
                wrong.push(at);
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a confirmation made outside the sinks: {wrong:?}"
    );
}
