//! HTML building blocks: [`esc`] (every string from a model, client, provider or the store
//! goes through it before it reaches a page), the page shell (nav, the stylesheet and the
//! refresh script, both from our own routes) and number formatting.

use std::fmt::Write;

/// `s` with `& < > " '` escaped, safe in element text and in quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` percent-encoded for a query string value.
pub fn url(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The whole page: `title` (escaped here) and `body` (already HTML).
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{t} · samewise</title><link rel=\"icon\" href=\"data:,\"><link rel=\"stylesheet\" href=\"/assets/style.css\">\
         <script src=\"/assets/refresh.js\" defer></script></head>\
         <body data-refresh=\"60\"><header><nav><a href=\"/\">Overview</a> \
         <a href=\"/alerts\">Alerts</a> <a href=\"/compare\">Compare</a>\
         <form method=\"post\" action=\"/logout\" class=\"inline\"><button>Log out</button></form>\
         </nav></header><main><h1>{t}</h1>{body}</main></body></html>",
        t = esc(title)
    )
}

/// A number with up to `digits` decimals, "—" for None.
pub fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("—".to_owned(), |v| format!("{v:.digits$}"))
}

/// A share as a percentage, "—" for None.
pub fn pct(v: Option<f64>) -> String {
    v.map_or("—".to_owned(), |v| format!("{:.1}%", v * 100.0))
}

/// A unix-milliseconds time as `YYYY-MM-DD HH:MM` UTC (the store's formatter, to the minute).
pub fn time(ms: i64) -> String {
    let mut t = samewise_store::utc_text(ms);
    t.truncate("YYYY-MM-DD HH:MM".len());
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<script>alert('x')&\"</script>"),
            "&lt;script&gt;alert(&#39;x&#39;)&amp;&quot;&lt;/script&gt;"
        );
        assert_eq!(url("p/m a"), "p%2Fm%20a");
        assert_eq!(time(1_767_225_600_000), "2026-01-01 00:00");
    }
}
