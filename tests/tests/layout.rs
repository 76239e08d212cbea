//! The whole workspace stays a room a newcomer can work in: in every crate the top-level modules
//! import each other without circles, no source file grows past 800 lines and no function past
//! 120 (tests aside). What is over the limits today is named below with its size: it may shrink,
//! not grow, and once it is within the limits its entry must go (the test says so).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use fleetmend_tests::workspace_root;

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 120;

/// Every crate's source folder, by crate.
const CRATES: &[(&str, &str)] = &[
    ("fleetmend", "src"),
    ("proto", "proto/src"),
    ("process", "process/src"),
    ("listener", "listener/src"),
    ("slurm", "slurm/src"),
    ("agent", "agent/src"),
    ("repairer", "repairer/src"),
    ("runtime", "runtime/src"),
    ("local", "local/src"),
    ("sim", "sim/src"),
    ("tests", "tests/src"),
];

/// Circles the layout asks for: (crate, the modules, why).
const ALLOWED_CIRCLES: &[(&str, &str, &str)] = &[(
    "repairer",
    "queue, scheduler",
    "scheduler/embedded.rs adapts the queue to the Scheduler trait, whose types the queue speaks",
)];

/// Circles that are there today and are to be untangled: (crate, the modules).
const KNOWN_CIRCLES: &[(&str, &str)] = &[
    // The config imports each check's settings; the checks import its paths and schedule back.
    ("agent", "checks, config, evidence, gpu, node, runner"),
    ("agent", "allreduce, commands"),
    ("local", "faults, tree"),
    ("local", "provider, scenario, up"),
];

/// Files past 800 lines today, with their size (crate-relative path under `src`): none. A file
/// that grows past the limit is split by responsibility, not listed.
const KNOWN_LONG_FILES: &[(&str, &str, usize)] = &[];

/// Functions past 120 lines today, with their length: (crate, file, function name, lines).
const KNOWN_LONG_FNS: &[(&str, &str, &str, usize)] = &[("local", "up.rs", "run", 198)];

/// What one crate's source breaks of the rules, before the known entries are taken off.
#[derive(Debug, Default, PartialEq)]
struct Breaches {
    /// The top-level modules that import each other round a loop, each circle as its modules'
    /// names in order (`config, evidence, node`).
    circles: BTreeSet<String>,
    /// (path under src, lines).
    long_files: BTreeMap<String, usize>,
    /// (path under src, function name) → lines.
    long_fns: BTreeMap<(String, String), usize>,
}

fn source_files(src: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    files.sort();
    files
}

/// The code of a file: before its unit tests, without comment lines.
fn code(text: &str) -> String {
    let before_tests = text.split("#[cfg(test)]").next().unwrap_or("");
    before_tests
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_test_file(relative: &str) -> bool {
    relative.ends_with("tests.rs") || relative.contains("/tests/")
}

/// The function a line starts (`pub async fn name(`...), if it starts one with a body.
fn function_name(line: &str) -> Option<String> {
    let trimmed = line.trim_start();
    let after =
        ["fn ", "pub fn ", "pub(crate) fn ", "pub(super) fn ", "async fn ", "pub async fn "]
            .iter()
            .find_map(|p| trimmed.strip_prefix(p))?;
    if trimmed.ends_with(';') {
        return None;
    }
    Some(after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect())
}

/// Every breach of the rules in the crate whose source is `src`.
fn breaches(src: &Path) -> Breaches {
    let mut found = Breaches::default();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in source_files(src) {
        let relative = file.strip_prefix(src).unwrap().display().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            found.long_files.insert(relative.clone(), lines);
        }
        if is_test_file(&relative) {
            continue;
        }
        let body: Vec<&str> = text.split("#[cfg(test)]").next().unwrap_or("").lines().collect();
        for (start, line) in body.iter().enumerate() {
            let Some(name) = function_name(line) else { continue };
            let indent = &line[..line.len() - line.trim_start().len()];
            let end = body[start..].iter().position(|l| *l == format!("{indent}}}"));
            if let Some(length) = end
                && length > MAX_FN_LINES
            {
                found.long_fns.insert((relative.clone(), name), length);
            }
        }
        if relative == "lib.rs" || relative == "main.rs" {
            continue;
        }
        let module = relative.split('/').next().unwrap().trim_end_matches(".rs").to_owned();
        let code = code(&text);
        let deps = graph.entry(module.clone()).or_default();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let dep: String =
                rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !dep.is_empty() && dep != module {
                deps.insert(dep);
            }
        }
    }
    // Two modules are in one circle when each reaches the other.
    let reach = |from: &String| {
        let mut seen: BTreeSet<String> = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(module) = todo.pop() {
            for dep in graph.get(&module).into_iter().flatten() {
                if seen.insert(dep.clone()) {
                    todo.push(dep.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    for (module, reached) in &reaches {
        let circle: BTreeSet<String> = reached
            .iter()
            .filter(|other| reaches.get(other).is_some_and(|back| back.contains(*module)))
            .cloned()
            .chain(std::iter::once((*module).clone()))
            .collect();
        if circle.len() > 1 {
            found.circles.insert(circle.into_iter().collect::<Vec<_>>().join(", "));
        }
    }
    found
}

/// What breaks the rules beyond the named entries, and named entries that no longer apply.
fn problems(krate: &str, found: &Breaches) -> Vec<String> {
    problems_against(krate, found, KNOWN_LONG_FILES)
}

/// [`problems`], with `known_long_files` as the list of long files.
fn problems_against(
    krate: &str,
    found: &Breaches,
    known_long_files: &[(&str, &str, usize)],
) -> Vec<String> {
    let mut problems = Vec::new();
    let named = |circle: &str| {
        ALLOWED_CIRCLES.iter().any(|(c, m, _)| *c == krate && *m == circle)
            || KNOWN_CIRCLES.iter().any(|(c, m)| *c == krate && *m == circle)
    };
    for circle in &found.circles {
        if !named(circle) {
            problems.push(format!("{krate}: modules {circle} import each other in a circle"));
        }
    }
    for (c, circle) in KNOWN_CIRCLES.iter().filter(|(c, _)| *c == krate) {
        if !found.circles.contains(*circle) {
            problems.push(format!(
                "{c}: {circle} no longer form that circle: change or take off its KNOWN_CIRCLES entry"
            ));
        }
    }
    for (file, lines) in &found.long_files {
        match known_long_files.iter().find(|(c, f, _)| *c == krate && f == file) {
            None => problems.push(format!("{krate}: {file} is {lines} lines (at most {MAX_FILE_LINES})")),
            Some((.., known)) if lines > known => problems.push(format!(
                "{krate}: {file} is {lines} lines, past the {known} it had: split it, do not grow it"
            )),
            Some(_) => {}
        }
    }
    for (_, file, known) in known_long_files.iter().filter(|(c, ..)| *c == krate) {
        if !found.long_files.contains_key(*file) {
            problems.push(format!(
                "{krate}: {file} is within {MAX_FILE_LINES} lines now (it had {known}): take it off KNOWN_LONG_FILES"
            ));
        }
    }
    for ((file, name), lines) in &found.long_fns {
        match KNOWN_LONG_FNS.iter().find(|(c, f, n, _)| *c == krate && f == file && n == name) {
            None => problems.push(format!(
                "{krate}: {file}: fn {name} is {lines} lines (at most {MAX_FN_LINES})"
            )),
            Some((.., known)) if lines > known => problems.push(format!(
                "{krate}: {file}: fn {name} is {lines} lines, past the {known} it had"
            )),
            Some(_) => {}
        }
    }
    for (_, file, name, known) in KNOWN_LONG_FNS.iter().filter(|(c, ..)| *c == krate) {
        if !found.long_fns.contains_key(&(file.to_string(), name.to_string())) {
            problems.push(format!(
                "{krate}: {file}: fn {name} is within {MAX_FN_LINES} lines now (it had {known}): take it off KNOWN_LONG_FNS"
            ));
        }
    }
    problems
}

#[test]
fn every_crate_keeps_its_modules_without_circles_and_its_files_and_functions_short() {
    let root = workspace_root();
    let mut all = Vec::new();
    for (krate, src) in CRATES {
        all.extend(problems(krate, &breaches(&root.join(src))));
    }
    assert!(all.is_empty(), "the layout's rules:\n{}", all.join("\n"));
}

#[test]
fn every_crate_of_the_workspace_is_guarded() {
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
    let members = manifest
        .lines()
        .find_map(|l| l.strip_prefix("members = "))
        .expect("the workspace's members line");
    for member in members.trim_matches(|c| c == '[' || c == ']').split(',') {
        let member = member.trim().trim_matches('"');
        let src = format!("{member}/src");
        assert!(CRATES.iter().any(|(_, s)| *s == src), "{member} is not in CRATES");
    }
}

#[test]
fn a_planted_long_file_long_function_and_circle_are_each_named() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("b")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
    let long_fn = format!("pub fn long() {{\n{}}}\n", "    let _ = 1;\n".repeat(130));
    let filler = "// filler\n".repeat(900);
    std::fs::write(src.join("a.rs"), format!("use crate::b::x;\n{long_fn}{filler}")).unwrap();
    std::fs::write(src.join("b/mod.rs"), "pub fn x() {}\npub fn y() { crate::a::long() }\n")
        .unwrap();

    let found = breaches(&src);
    assert_eq!(found.circles, BTreeSet::from(["a, b".to_owned()]));
    assert_eq!(found.long_files.keys().collect::<Vec<_>>(), ["a.rs"]);
    assert_eq!(found.long_fns.get(&("a.rs".to_owned(), "long".to_owned())), Some(&131));
    let problems = problems("planted", &found);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("modules a, b import each other"), "{problems:#?}");
    assert!(problems[1].contains("a.rs is 1033 lines (at most 800)"), "{problems:#?}");
    assert!(problems[2].contains("fn long is 131 lines (at most 120)"), "{problems:#?}");
}

#[test]
fn a_known_long_file_that_grows_is_named_and_one_that_shrank_must_leave_the_list() {
    // A file listed as 900 lines long: planted past its size, then within the limit.
    let known_long_files = [("planted", "big/mod.rs", 900)];
    let (krate, file, known) = known_long_files[0];
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let planted = src.join(file);
    std::fs::create_dir_all(planted.parent().unwrap()).unwrap();
    std::fs::write(src.join("lib.rs"), "").unwrap();

    std::fs::write(&planted, "// line\n".repeat(known + 68)).unwrap();
    let grown = problems_against(krate, &breaches(&src), &known_long_files);
    let named = format!(
        "{krate}: {file} is {} lines, past the {known} it had: split it, do not grow it",
        known + 68
    );
    assert!(grown.contains(&named), "{grown:#?}");

    std::fs::write(&planted, "// line\n".repeat(MAX_FILE_LINES)).unwrap();
    let shrank = problems_against(krate, &breaches(&src), &known_long_files);
    let named = format!(
        "{krate}: {file} is within {MAX_FILE_LINES} lines now (it had {known}): take it off KNOWN_LONG_FILES"
    );
    assert!(shrank.contains(&named), "{shrank:#?}");
}
