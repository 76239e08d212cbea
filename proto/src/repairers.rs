//! Several repairers behind one fleet: their base URLs as agents and the CLI are given them, and
//! how a standby points at the leader.
//!
//! A standby refuses what only the leader may do (a report, an alert, an operator's write) with
//! 503, `Retry-After`, and [`LEADER_HEADER`] naming the leader's base URL when it knows it. A
//! client follows that header only to a repairer it was configured with: a base URL compares by
//! its [`normalise`]d form (scheme, host, port, path without a trailing slash).

/// The header a standby names the leader's base URL in.
pub const LEADER_HEADER: &str = "fleetmend-leader";

/// The most repairer URLs one list may hold.
pub const MAX_REPAIRERS: usize = 16;

/// `text` as a repairer base URL in the one form that compares equal for the same repairer:
/// `scheme://host:port/path`, the port always written, the path without a trailing slash. An
/// error says why it is not an `http://` or `https://` base URL.
pub fn normalise(text: &str) -> Result<String, String> {
    let url =
        url::Url::parse(text.trim()).map_err(|err| format!("{text:?} is not a URL: {err}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{text:?} is not an http:// or https:// URL"));
    }
    let host = url.host_str().filter(|h| !h.is_empty());
    let (Some(host), Some(port)) = (host, url.port_or_known_default()) else {
        return Err(format!("{text:?} names no host"));
    };
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{text:?} is a base URL: no query or fragment"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{text:?} carries credentials; use a token instead"));
    }
    Ok(format!("{}://{host}:{port}{}", url.scheme(), url.path().trim_end_matches('/')))
}

/// The URLs of a comma-separated list (`--repairer http://a:9830,http://b:9830`), each trimmed;
/// empty pieces are kept so that [`problems`] can name them.
pub fn split_list(text: &str) -> Vec<String> {
    text.split(',').map(|piece| piece.trim().to_owned()).collect()
}

/// Every problem of a list of repairer base URLs, each with the index of the URL it is about
/// (none: the list as a whole): not a base URL, the same repairer twice, an empty list, a list
/// longer than [`MAX_REPAIRERS`].
pub fn problems(urls: &[String]) -> Vec<(Option<usize>, String)> {
    let mut problems = Vec::new();
    if urls.is_empty() {
        problems.push((None, "names no repairer".to_owned()));
    }
    if urls.len() > MAX_REPAIRERS {
        problems.push((
            None,
            format!("names {} repairers; at most {MAX_REPAIRERS} are taken", urls.len()),
        ));
    }
    let mut seen: Vec<(String, usize)> = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        if url.trim().is_empty() {
            problems.push((Some(i), "is empty".to_owned()));
            continue;
        }
        match normalise(url) {
            Ok(key) => match seen.iter().find(|(other, _)| *other == key) {
                Some((_, first)) => problems
                    .push((Some(i), format!("{url:?} is the same repairer as entry {first}"))),
                None => seen.push((key, i)),
            },
            Err(message) => problems.push((Some(i), message)),
        }
    }
    problems
}

/// The position in `urls` of the repairer `leader` names, compared normalised; none when it is
/// not one of them (or not a URL at all).
pub fn position(urls: &[String], leader: &str) -> Option<usize> {
    let key = normalise(leader).ok()?;
    urls.iter().position(|url| normalise(url).is_ok_and(|u| u == key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_repairer_normalises_to_one_form() {
        for same in [
            "http://r1:9830",
            "http://r1:9830/",
            "HTTP://R1:9830",
            " http://r1:9830 ",
            "http://r1:9830//",
        ] {
            assert_eq!(normalise(same).as_deref(), Ok("http://r1:9830"), "{same}");
        }
        assert_eq!(normalise("https://r1").as_deref(), Ok("https://r1:443"));
        assert_eq!(normalise("https://r1:443/").as_deref(), Ok("https://r1:443"));
        assert_eq!(normalise("http://r1").as_deref(), Ok("http://r1:80"));
        assert_eq!(normalise("http://[::1]:9830").as_deref(), Ok("http://[::1]:9830"));
        assert_eq!(normalise("http://proxy:80/fm/").as_deref(), Ok("http://proxy:80/fm"));
        // Scheme and port tell repairers apart.
        assert_ne!(normalise("http://r1:9830"), normalise("https://r1:9830"));
        assert_ne!(normalise("http://r1:9830"), normalise("http://r1:9831"));
    }

    #[test]
    fn what_is_not_a_base_url_is_refused_with_the_reason() {
        for (bad, says) in [
            ("ftp://r1", "not an http:// or https://"),
            ("r1:9830", "not an http:// or https://"),
            ("not a url", "is not a URL"),
            ("http://r1:9830/?x=1", "no query or fragment"),
            ("http://user:pw@r1:9830", "credentials"),
            ("http://r1:99999", "is not a URL"),
        ] {
            let err = normalise(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn a_list_is_split_on_commas_and_its_problems_name_the_entry() {
        assert_eq!(split_list("http://a:1, http://b:2"), ["http://a:1", "http://b:2"]);
        assert_eq!(split_list("http://a:1"), ["http://a:1"]);
        let list = split_list("http://a:1,,ftp://c,http://A:1/");
        let found = problems(&list);
        let at: Vec<Option<usize>> = found.iter().map(|(i, _)| *i).collect();
        assert_eq!(at, [Some(1), Some(2), Some(3)], "{found:?}");
        assert!(found[2].1.contains("same repairer as entry 0"), "{found:?}");
        assert!(problems(&split_list("http://a:1,https://a:1")).is_empty());
        let long: Vec<String> = (0..17).map(|i| format!("http://r{i}:9830")).collect();
        assert_eq!(problems(&long).len(), 1);
        assert!(problems(&long)[0].1.contains("at most 16"));
        assert!(problems(&[])[0].1.contains("names no repairer"));
    }

    #[test]
    fn a_leader_is_found_only_among_the_configured_urls() {
        let urls = vec!["http://r1:9830".to_owned(), "https://r2:9830/".to_owned()];
        assert_eq!(position(&urls, "https://R2:9830"), Some(1));
        assert_eq!(position(&urls, "http://r1:9830/"), Some(0));
        assert_eq!(position(&urls, "http://r2:9830"), None);
        assert_eq!(position(&urls, "http://evil:9830"), None);
        assert_eq!(position(&urls, "garbage"), None);
    }
}
