//! What a config's validation reports: every problem at once, each naming its field. One type for
//! the agent's and the repairer's configs (and the simulator's, which reads the agent's), so a
//! problem reads the same wherever it was found; here because both link this crate and the agent
//! must not link the repairer.

use std::fmt;

/// One thing wrong with a config, naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The dotted path of the field, e.g. `provider.reboot_timeout` or `checks.gpu.interval`.
    pub field: String,
    pub message: String,
}

impl ConfigProblem {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> ConfigProblem {
        ConfigProblem { field: field.into(), message: message.into() }
    }
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem found in a config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigProblems(pub Vec<ConfigProblem>);

impl ConfigProblems {
    pub fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigProblem::new(field, message));
    }

    /// Adds `others`, each field under `prefix` (`catalog.` + `categories[2].count`).
    pub fn extend_under(&mut self, prefix: &str, others: ConfigProblems) {
        self.0.extend(others.0.into_iter().map(|problem| ConfigProblem {
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

    pub fn iter(&self) -> impl Iterator<Item = &ConfigProblem> {
        self.0.iter()
    }

    /// Whether a problem names `field`.
    pub fn names(&self, field: &str) -> bool {
        self.0.iter().any(|problem| problem.field == field)
    }
}

/// One problem a line, indented under the error that carries them.
impl fmt::Display for ConfigProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  {problem}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_names_its_field() {
        let problem = ConfigProblem::new("provider.reboot_timeout", "must be greater than zero");
        assert_eq!(problem.to_string(), "provider.reboot_timeout: must be greater than zero");
    }

    #[test]
    fn problems_are_listed_one_a_line_and_found_by_field() {
        let mut problems = ConfigProblems::default();
        assert!(problems.is_empty());
        assert_eq!(problems.to_string(), "");
        problems.push("checks.gpu.interval", "must be greater than zero");
        problems.push("checks.gpu.timeout", "10s is longer than the interval 5s");
        assert_eq!(problems.len(), 2);
        assert!(problems.names("checks.gpu.timeout"));
        assert!(!problems.names("checks.gpu"));
        assert_eq!(
            problems.to_string(),
            "  checks.gpu.interval: must be greater than zero\n  checks.gpu.timeout: 10s is longer \
             than the interval 5s"
        );
    }

    #[test]
    fn problems_are_taken_in_under_a_prefix() {
        let mut inner = ConfigProblems::default();
        inner.push("categories[2].count", "must be at least 1");
        let mut outer = ConfigProblems::default();
        outer.push("seed", "is missing");
        outer.extend_under("catalog.", inner);
        let fields: Vec<&str> = outer.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["seed", "catalog.categories[2].count"]);
    }
}
