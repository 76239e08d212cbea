//! Training data: a byte corpus (a synthetic one from the seed, or a file) and the batch of each
//! (step, rank), a pure function of (seed, step, rank, world size). So the data cursor of a run is
//! its step, and a resumed run sees exactly the batches the uninterrupted one would have.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::model::{SplitMix64, mix64};

/// Size of the synthetic corpus.
const SYNTHETIC_BYTES: usize = 1 << 20;

/// The synthetic corpus's vocabulary: drawn with Zipf-like frequencies (the first words most
/// often), so there is plenty for a small model to learn (spelling, spacing, frequent words).
const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "it",
    "that",
    "was",
    "for",
    "on",
    "with",
    "as",
    "node",
    "rank",
    "step",
    "loss",
    "fleet",
    "repair",
    "checkpoint",
    "gradient",
    "train",
    "model",
    "drain",
    "resume",
    "queue",
    "job",
    "signal",
    "write",
    "disk",
    "network",
    "kernel",
    "driver",
    "memory",
    "error",
    "healthy",
    "restart",
    "weights",
    "batch",
    "layer",
    "token",
    "attention",
    "optimizer",
    "learning",
    "rate",
    "warm",
    "cold",
    "fast",
    "slow",
    "small",
    "large",
    "every",
    "after",
    "before",
    "again",
    "never",
    "always",
    "then",
    "while",
    "when",
    "here",
    "there",
];

/// Where the corpus came from, as recorded in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DataSource {
    /// The synthetic corpus generated from the seed.
    Synthetic {
        /// Its length in bytes.
        bytes: usize,
    },
    /// A text file (`--data`).
    File {
        /// The path given.
        path: PathBuf,
        /// Its length in bytes.
        bytes: usize,
        /// SHA-256 of its contents, lowercase hex: a resumed run on other data says so.
        sha256: String,
    },
}

/// The corpus a run trains on.
#[derive(Debug, Clone)]
pub struct Corpus {
    bytes: Vec<u8>,
    source: DataSource,
}

/// `--data FILE` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadCorpusError {
    /// Reading failed.
    #[error("cannot read training data {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Too short for one training sequence.
    #[error("training data {path} has {bytes} bytes; at least {needed} are needed (--context + 1)")]
    TooShort {
        /// The file.
        path: PathBuf,
        /// Its length.
        bytes: usize,
        /// The least usable length.
        needed: usize,
    },
}

impl Corpus {
    /// The synthetic corpus of `seed`: sentences of words from a fixed list with skewed
    /// frequencies.
    pub fn synthetic(seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed ^ 0xDA7A_0000_0000_0000);
        // Zipf weights 1/(k+1), as a cumulative table.
        let mut cumulative = Vec::with_capacity(WORDS.len());
        let mut total = 0.0;
        for k in 0..WORDS.len() {
            total += 1.0 / (k as f64 + 1.0);
            cumulative.push(total);
        }
        let mut bytes = Vec::with_capacity(SYNTHETIC_BYTES + 128);
        while bytes.len() < SYNTHETIC_BYTES {
            let words = 3 + (rng.next_u64() % 10) as usize;
            for i in 0..words {
                let pick = rng.uniform() * total;
                let k = cumulative.partition_point(|&c| c <= pick).min(WORDS.len() - 1);
                let word = WORDS[k].as_bytes();
                if i == 0 {
                    bytes.push(word[0].to_ascii_uppercase());
                    bytes.extend_from_slice(&word[1..]);
                } else {
                    bytes.push(b' ');
                    bytes.extend_from_slice(word);
                }
            }
            bytes.extend_from_slice(if rng.next_u64().is_multiple_of(4) { b".\n" } else { b". " });
        }
        bytes.truncate(SYNTHETIC_BYTES);
        Corpus { bytes, source: DataSource::Synthetic { bytes: SYNTHETIC_BYTES } }
    }

    /// The contents of `path`, which must hold at least one sequence of `context` + 1 bytes.
    pub fn from_file(path: &Path, context: usize) -> Result<Self, LoadCorpusError> {
        let bytes = std::fs::read(path)
            .map_err(|source| LoadCorpusError::Read { path: path.to_path_buf(), source })?;
        if bytes.len() < context + 1 {
            return Err(LoadCorpusError::TooShort {
                path: path.to_path_buf(),
                bytes: bytes.len(),
                needed: context + 1,
            });
        }
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let source = DataSource::File { path: path.to_path_buf(), bytes: bytes.len(), sha256 };
        Ok(Corpus { bytes, source })
    }

    /// Where it came from.
    pub fn source(&self) -> &DataSource {
        &self.source
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The inputs and next-byte targets (each `batch_size` × `context`, row-major) of `rank` at
    /// `step` (1-based): a pure function of (seed, step, rank, world size). The rows of all ranks
    /// at one step are consecutive rows of one global batch.
    pub fn batch(&self, spec: BatchSpec, step: u64, rank: usize) -> (Vec<u32>, Vec<u32>) {
        let BatchSpec { seed, world_size, batch_size, context } = spec;
        let starts = self.bytes.len().saturating_sub(context + 1) as u64 + 1;
        let mut inputs = Vec::with_capacity(batch_size * context);
        let mut targets = Vec::with_capacity(batch_size * context);
        for row in 0..batch_size {
            let global_row = (step.saturating_sub(1) * world_size as u64 + rank as u64)
                * batch_size as u64
                + row as u64;
            let start = (mix64(mix64(seed ^ 0xBA7C_0000_0000_0000) ^ global_row) % starts) as usize;
            let window = &self.bytes[start..start + context + 1];
            inputs.extend(window[..context].iter().map(|&b| u32::from(b)));
            targets.extend(window[1..].iter().map(|&b| u32::from(b)));
        }
        (inputs, targets)
    }
}

/// What a batch depends on besides the step and the rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSpec {
    /// The run's seed.
    pub seed: u64,
    /// Ranks in the job.
    pub world_size: usize,
    /// Sequences per rank per step.
    pub batch_size: usize,
    /// Bytes per sequence.
    pub context: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: BatchSpec = BatchSpec { seed: 3, world_size: 4, batch_size: 8, context: 64 };

    #[test]
    fn synthetic_corpus_is_a_function_of_the_seed_and_readable() {
        let a = Corpus::synthetic(1);
        assert_eq!(a.bytes().len(), SYNTHETIC_BYTES);
        assert_eq!(a.bytes(), Corpus::synthetic(1).bytes());
        assert_ne!(a.bytes(), Corpus::synthetic(2).bytes());
        let text = String::from_utf8_lossy(&a.bytes()[..200]).to_string();
        assert!(text.contains(" the ") || text.contains("The "), "{text}");
    }

    #[test]
    fn batches_are_pure_functions_of_seed_step_rank_and_world() {
        let corpus = Corpus::synthetic(3);
        let (inputs, targets) = corpus.batch(SPEC, 17, 2);
        assert_eq!(inputs.len(), 8 * 64);
        assert_eq!((inputs.clone(), targets.clone()), corpus.batch(SPEC, 17, 2));
        // Targets are the inputs shifted by one byte.
        assert_eq!(inputs[1..64], targets[..63]);
        assert_ne!(inputs, corpus.batch(SPEC, 17, 3).0);
        assert_ne!(inputs, corpus.batch(SPEC, 18, 2).0);
        assert_ne!(inputs, corpus.batch(BatchSpec { seed: 4, ..SPEC }, 17, 2).0);
    }

    #[test]
    fn a_short_file_is_refused_with_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.txt");
        std::fs::write(&path, b"abc").unwrap();
        let err = Corpus::from_file(&path, 64).unwrap_err().to_string();
        assert!(err.contains("3 bytes") && err.contains("65"), "{err}");
        std::fs::write(&path, vec![b'x'; 65]).unwrap();
        let corpus = Corpus::from_file(&path, 64).unwrap();
        assert_eq!(corpus.batch(BatchSpec { world_size: 1, ..SPEC }, 1, 0).0.len(), 8 * 64);
    }
}
