//! The checkpoint manifest's fuzz target body ([`check_manifest`]).

use std::cell::RefCell;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use super::{FORMAT_VERSION, MANIFEST_FILE, Manifest, step_dir_name, verify};

/// The step of the directory the fuzzed manifest lands in.
const STEP: u64 = 7;

/// The files that directory holds besides the manifest (an empty one too).
const FILES: [(&str, &[u8]); 3] =
    [("model.safetensors", b"weights"), ("optimizer.bin", b""), ("rank-1.json", b"{}")];

/// A checkpoint directory of this thread's own (the stable tests run targets on several
/// threads), removed when the thread ends.
struct Scratch {
    root: PathBuf,
    step_dir: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let root = std::env::temp_dir().join(format!(
            "fleetmend-fuzz-manifest-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let step_dir = root.join(step_dir_name(STEP));
        let made = fs::create_dir_all(&step_dir).and_then(|()| {
            FILES.iter().try_for_each(|(name, bytes)| fs::write(step_dir.join(name), bytes))
        });
        if let Err(err) = made {
            panic!("making {}: {err}", step_dir.display());
        }
        Scratch { root, step_dir }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

thread_local! {
    static SCRATCH: RefCell<Option<Scratch>> = const { RefCell::new(None) };
}

/// Whether the manifest in `bytes` describes [`FILES`] in a directory of [`STEP`] consistently:
/// a format this code reads, the directory's step, at least one rank, each file named once, and
/// every file it names there with its size and SHA-256.
fn consistent(bytes: &[u8]) -> Option<Manifest> {
    let manifest: Manifest = serde_json::from_slice(bytes).ok()?;
    let ok = manifest.format_version <= FORMAT_VERSION
        && manifest.step == STEP
        && manifest.world_size >= 1
        && manifest.files.iter().enumerate().all(|(i, file)| {
            let unique = manifest.files[..i].iter().all(|f| f.name != file.name);
            let on_disk = FILES.iter().find(|(name, _)| *name == file.name);
            unique
                && on_disk.is_some_and(|(_, contents)| {
                    file.size == contents.len() as u64
                        && file.sha256.eq_ignore_ascii_case(&hex::encode(Sha256::digest(contents)))
                })
        });
    ok.then_some(manifest)
}

fn verify_in(step_dir: &Path, bytes: &[u8]) -> Option<Manifest> {
    if let Err(err) = fs::write(step_dir.join(MANIFEST_FILE), bytes) {
        panic!("writing the manifest: {err}");
    }
    verify(step_dir).ok().map(|valid| valid.manifest)
}

/// `data` as the `manifest.json` of `step-00000007/` beside three files.
///
/// Holds: `verify` accepts the checkpoint exactly when the manifest is consistent with the
/// directory (see [`consistent`]), and then hands back the manifest as written; an accepted
/// manifest serialises and parses back equal.
pub fn check_manifest(data: &[u8]) {
    let accepted = SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        let scratch = scratch.get_or_insert_with(Scratch::new);
        verify_in(&scratch.step_dir, data)
    });
    let expected = consistent(data);
    assert_eq!(accepted, expected, "verify and the manifest's consistency disagree");
    if let Some(manifest) = accepted {
        let json = match serde_json::to_vec(&manifest) {
            Ok(json) => json,
            Err(err) => panic!("an accepted manifest does not serialise: {err}"),
        };
        match serde_json::from_slice::<Manifest>(&json) {
            Ok(again) => assert_eq!(again, manifest),
            Err(err) => panic!("a serialised manifest does not parse back: {err}"),
        }
    }
}
