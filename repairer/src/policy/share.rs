//! A limit that grows with the fleet: a count of nodes (`32`) or a share of the fleet (`"2%"`).
//! Guard rails that stop a storm must not throttle a large fleet's normal failure rate: a count
//! sized for five nodes holds back most repairs of two thousand.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A number of nodes, given as a count or as a share of the fleet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FleetShare {
    /// This many nodes, whatever the fleet's size.
    Nodes(u32),
    /// This percentage of the fleet, rounded up (and never below one node).
    Percent(f64),
}

impl FleetShare {
    /// How many nodes it comes to in a fleet of `fleet` nodes: a share above 0 % rounds up and is
    /// at least one node, so a small fleet still gets one.
    pub fn of(self, fleet: u32) -> u32 {
        match self {
            FleetShare::Nodes(n) => n,
            FleetShare::Percent(percent) if percent <= 0.0 => 0,
            FleetShare::Percent(percent) => {
                let nodes = (f64::from(fleet) * percent / 100.0).ceil();
                (nodes.min(f64::from(u32::MAX)) as u32).max(1)
            }
        }
    }

    /// What is wrong with it as a limit of at least one node, if anything: no count of zero, no
    /// share outside (0, 100] %.
    pub fn problem(self) -> Option<String> {
        match self {
            FleetShare::Nodes(0) => {
                Some("must be at least 1 node (or a share such as \"2%\")".to_owned())
            }
            FleetShare::Percent(p) if !(p > 0.0 && p <= 100.0) => {
                Some(format!("{p}% must be a share above 0% and at most 100%"))
            }
            _ => None,
        }
    }

    /// What is wrong with it as a number of nodes that may be none, if anything: no share outside
    /// [0, 100] %.
    pub fn problem_if_any(self) -> Option<String> {
        match self {
            FleetShare::Percent(p) if !(0.0..=100.0).contains(&p) => {
                Some(format!("{p}% must be a share from 0% to 100%"))
            }
            _ => None,
        }
    }
}

impl fmt::Display for FleetShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FleetShare::Nodes(n) => write!(f, "{n}"),
            FleetShare::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl std::str::FromStr for FleetShare {
    type Err = String;

    fn from_str(text: &str) -> Result<FleetShare, String> {
        let text = text.trim();
        let wrong = || {
            format!(
                "{text:?} is neither a count of nodes (32) nor a share of the fleet (\"2%\", \"0.5%\")"
            )
        };
        match text.strip_suffix('%') {
            Some(percent) => {
                let value: f64 = percent.trim().parse().map_err(|_| wrong())?;
                if value.is_finite() { Ok(FleetShare::Percent(value)) } else { Err(wrong()) }
            }
            None => text.parse().map(FleetShare::Nodes).map_err(|_| wrong()),
        }
    }
}

impl Serialize for FleetShare {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            FleetShare::Nodes(n) => serializer.serialize_u32(*n),
            FleetShare::Percent(_) => serializer.serialize_str(&self.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for FleetShare {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<FleetShare, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = FleetShare;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a count of nodes (32) or a share of the fleet (\"2%\")")
            }

            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<FleetShare, E> {
                u32::try_from(value)
                    .map(FleetShare::Nodes)
                    .map_err(|_| E::custom(format!("{value} nodes is more than any fleet")))
            }

            fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<FleetShare, E> {
                u64::try_from(value)
                    .map_err(|_| E::custom(format!("{value} is not a count of nodes")))
                    .and_then(|v| self.visit_u64(v))
            }

            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<FleetShare, E> {
                value.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, Serialize, PartialEq)]
    struct Doc {
        limit: FleetShare,
    }

    fn parse(text: &str) -> Result<FleetShare, String> {
        toml::from_str::<Doc>(text).map(|d| d.limit).map_err(|e| e.to_string())
    }

    #[test]
    fn counts_and_shares_read_and_write_back_as_written() {
        assert_eq!(parse("limit = 32"), Ok(FleetShare::Nodes(32)));
        assert_eq!(parse("limit = \"2%\""), Ok(FleetShare::Percent(2.0)));
        assert_eq!(parse("limit = \"0.5 %\""), Ok(FleetShare::Percent(0.5)));
        assert_eq!(parse("limit = \"16\""), Ok(FleetShare::Nodes(16)));
        for text in ["limit = 32\n", "limit = \"2.5%\"\n"] {
            let doc: Doc = toml::from_str(text).unwrap();
            assert_eq!(toml::to_string(&doc).unwrap(), text);
        }
    }

    #[test]
    fn a_bad_limit_says_what_it_takes() {
        for text in
            ["limit = \"two\"", "limit = \"2%%\"", "limit = -3", "limit = 1.5", "limit = \"nan%\""]
        {
            let err = parse(text).unwrap_err();
            assert!(err.contains("count of nodes") || err.contains("not a count"), "{text}: {err}");
        }
        assert!(FleetShare::Nodes(0).problem().is_some());
        assert!(FleetShare::Percent(0.0).problem().is_some());
        assert!(FleetShare::Percent(120.0).problem().is_some());
        assert_eq!(FleetShare::Percent(100.0).problem(), None);
    }

    #[test]
    fn a_share_rounds_up_and_is_never_below_one_node() {
        assert_eq!(FleetShare::Percent(2.0).of(2048), 41);
        assert_eq!(FleetShare::Percent(2.0).of(100), 2);
        assert_eq!(FleetShare::Percent(2.0).of(5), 1);
        assert_eq!(FleetShare::Percent(2.0).of(0), 1);
        assert_eq!(FleetShare::Percent(100.0).of(7), 7);
        assert_eq!(FleetShare::Nodes(32).of(5), 32);
        assert_eq!(FleetShare::Percent(0.0).of(2048), 0);
        assert_eq!(FleetShare::Nodes(0).problem_if_any(), None);
        assert!(FleetShare::Percent(-1.0).problem_if_any().is_some());
    }
}
