//! How the CLI prints: aligned tables, `name  value` lines, durations for people, and JSON.
//!
//! Pure formatting into `String`s (the callers write them), so it is tested without a server.

use std::io::Write;

use serde::Serialize;

/// Rows under a header, each column as wide as its widest cell, two spaces apart; the last
/// column is not padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let header: Vec<String> = header.iter().map(|cell| (*cell).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (column, cell) in row.iter().enumerate() {
            if column == last {
                text.push_str(cell);
            } else {
                let pad = widths[column] - cell.chars().count();
                text.push_str(cell);
                text.push_str(&" ".repeat(pad + 2));
            }
        }
        text.push('\n');
    }
    text
}

/// `name  value` lines, the names aligned; `None` values are shown as `-`.
pub fn fields(pairs: &[(&str, Option<String>)]) -> String {
    let width = pairs
        .iter()
        .map(|(name, _)| name.chars().count())
        .max()
        .unwrap_or(0);
    pairs
        .iter()
        .map(|(name, value)| format!("{name:<width$}  {}\n", value.as_deref().unwrap_or("-")))
        .collect()
}

/// Milliseconds for people: `850ms`, `30s`, `29.9s`, `4m05s`, `2h03m`, `3d04h`.
pub fn millis(ms: u64) -> String {
    const S: u64 = 1000;
    const M: u64 = 60 * S;
    const H: u64 = 60 * M;
    const D: u64 = 24 * H;
    match ms {
        ms if ms < S => format!("{ms}ms"),
        ms if ms < M && ms % S == 0 => format!("{}s", ms / S),
        ms if ms < M => format!("{:.1}s", ms as f64 / 1000.0),
        ms if ms < H => format!("{}m{:02}s", ms / M, ms % M / S),
        ms if ms < D => format!("{}h{:02}m", ms / H, ms % H / M),
        ms => format!("{}d{:02}h", ms / D, ms % D / H),
    }
}

/// An optional cell: the text, or `-`.
pub fn cell(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| value.to_string())
}

/// Writes `value` as one line of JSON to stdout.
pub fn json_line(value: &impl Serialize) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, value)?;
    stdout.write_all(b"\n")?;
    stdout.flush()
}

/// Writes `text` to stdout as it is.
pub fn print(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_say_them() {
        fn check(ms: u64, expected: &str) {
            assert_eq!(millis(ms), expected, "{ms}");
        }
        check(0, "0ms");
        check(999, "999ms");
        check(1000, "1s");
        check(30_000, "30s");
        check(1_500, "1.5s");
        check(29_949, "29.9s");
        check(60_000, "1m00s");
        check(245_000, "4m05s");
        check(3_600_000, "1h00m");
        check(7_380_000, "2h03m");
        check(86_400_000 + 4 * 3_600_000, "1d04h");
    }

    #[test]
    fn tables_align_columns_and_leave_the_last_unpadded() {
        let text = table(
            &["KEY", "SERVICE", "TTL"],
            &[
                vec!["api/host-1:8080".into(), "api".into(), "30s".into()],
                vec!["b".into(), "-".into(), "1.5s".into()],
            ],
        );
        assert_eq!(
            text,
            "KEY              SERVICE  TTL\n\
             api/host-1:8080  api      30s\n\
             b                -        1.5s\n"
        );
        assert_eq!(table(&["A"], &[]), "A\n");
    }

    #[test]
    fn fields_align_names_and_show_missing_values_as_a_dash() {
        let text = fields(&[("key", Some("a".into())), ("expires in", None)]);
        assert_eq!(text, "key         a\nexpires in  -\n");
    }
}
