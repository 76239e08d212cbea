//! What a config, a catalog or a model's inputs got wrong: every problem at once, each naming
//! its field (`categories[3].reboot_clears`, `lemons.fraction`).

use std::fmt;

/// One problem, by field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

/// Every problem found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    pub fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem { field: field.into(), message: message.into() });
    }

    /// Adds `others`, each field under `prefix` (`catalog.` + `categories[2].count`).
    pub fn extend_under(&mut self, prefix: &str, others: Problems) {
        self.0.extend(others.0.into_iter().map(|problem| Problem {
            field: format!("{prefix}{}", problem.field),
            message: problem.message,
        }));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Problem> {
        self.0.iter()
    }

    /// Whether a problem names `field`.
    pub fn names(&self, field: &str) -> bool {
        self.0.iter().any(|problem| problem.field == field)
    }
}

/// One problem a line: `  field: message`.
impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  {}: {}", problem.field, problem.message)?;
        }
        Ok(())
    }
}
