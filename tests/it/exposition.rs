//! Reads samples out of the server's OpenMetrics text in Rust, so that the tests that merely
//! read a counter need nothing outside Rust. Whether the text is valid OpenMetrics is checked
//! once, by the Prometheus project's own parser (`the_exposition_parses_with_the_prometheus_parser`,
//! which needs Python).

use std::collections::HashMap;

/// One sample: name, labels, value.
pub type Sample = (String, HashMap<String, String>, f64);

/// Every sample line of `text` (`name{label="value",...} value`); comment lines are skipped.
/// Panics on a line it cannot read, naming it.
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| sample(line).unwrap_or_else(|| panic!("unreadable sample line: {line:?}")))
        .collect()
}

fn sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let (labels, rest) = match line[name_end..].strip_prefix('{') {
        Some(inside) => labels(inside)?,
        None => (HashMap::new(), &line[name_end..]),
    };
    // The value, then an optional timestamp and exemplar.
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name, labels, value))
}

/// Reads `a="x",b="y"}` and returns the labels and what follows the `}`.
fn labels(mut text: &str) -> Option<(HashMap<String, String>, &str)> {
    let mut labels = HashMap::new();
    loop {
        if let Some(rest) = text.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (name, rest) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (at, '"') => break at,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, other) => value.push(other),
            }
        };
        labels.insert(name.to_owned(), value);
        text = rest[end + 1..]
            .strip_prefix(',')
            .unwrap_or(&rest[end + 1..]);
    }
}

/// The value of the sample `name` whose labels include `labels`.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|(sample, have, _)| {
            sample == name
                && labels
                    .iter()
                    .all(|(k, v)| have.get(*k).map(String::as_str) == Some(*v))
        })
        .unwrap_or_else(|| panic!("no sample {name} {labels:?}"))
        .2
}

#[test]
fn samples_are_read_with_labels_escapes_and_special_values() {
    let text = "# HELP x_total Things.\n# TYPE x counter\n\
                x_total{a=\"1\",b=\"q\\\"u\\\\o\\nte\"} 3\n\
                y 2.5\n\
                h_bucket{le=\"+Inf\"} 7 # {trace=\"z\"} 1\n\
                # EOF\n";
    let samples = samples(text);
    assert_eq!(samples.len(), 3);
    assert_eq!(value(&samples, "x_total", &[("a", "1")]), 3.0);
    assert_eq!(samples[0].1["b"], "q\"u\\o\nte");
    assert_eq!(value(&samples, "y", &[]), 2.5);
    assert_eq!(value(&samples, "h_bucket", &[("le", "+Inf")]), 7.0);
}

#[test]
#[should_panic(expected = "unreadable sample line")]
fn a_line_it_cannot_read_fails_loudly() {
    samples("x{a=\"1\" 3\n");
}
