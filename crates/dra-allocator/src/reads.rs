//! What a selector expression reads of a device, told from its text, so that selector
//! results can be shared by every device that agrees on those parts.
//!
//! Real devices differ in attributes no selector looks at (a UUID, a serial number), so a
//! cache keyed by everything CEL could see misses once per device. Most selectors only
//! read `device.driver` and a few `device.attributes["domain"].name` values; for those the
//! key is the driver plus exactly those values, and one evaluation serves all GPUs of a
//! kind. The analysis is deliberately narrow: any use of `device` other than the plain
//! access paths below (the whole map, a comprehension variable named `device`, a computed
//! key, optional selection, comments, escaped or raw strings) gives up, and such
//! expressions keep the per-device key.

/// One value an expression reads: `device.attributes[domain].name` (or the capacity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Read {
    pub capacity: bool,
    pub domain: String,
    pub name: String,
    /// `domain/name`, as the key appears in a device's map.
    pub qualified: String,
}

#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Punct(char),
    Other,
}

fn tokenize(expr: &str) -> Option<Vec<Token>> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '"' || c == '\'' {
            // A prefix (raw or bytes) or a triple quote: not handled, give up.
            if i > 0 && ident_char(chars[i - 1]) {
                return None;
            }
            if chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c) {
                return None;
            }
            let mut s = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None | Some('\\') | Some('\n') | Some('\r') => return None,
                    Some(&q) if q == c => break,
                    Some(&x) => s.push(x),
                }
                i += 1;
            }
            i += 1;
            out.push(Token::Str(s));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            while i < chars.len() && (ident_char(chars[i]) || chars[i] == '.') {
                i += 1;
            }
            out.push(Token::Other);
        } else if c == '/' && chars.get(i + 1) == Some(&'/') {
            return None; // a comment
        } else {
            out.push(Token::Punct(c));
            i += 1;
        }
    }
    Some(out)
}

/// The device values `expr` reads, or `None` when that cannot be told safely. An empty
/// list means: only `device.driver` and `device.allowMultipleAllocations`, if anything.
pub(crate) fn reads(expr: &str) -> Option<Vec<Read>> {
    let tokens = tokenize(expr)?;
    let punct = |i: usize, c: char| tokens.get(i) == Some(&Token::Punct(c));
    let string = |i: usize| match tokens.get(i) {
        Some(Token::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let mut out: Vec<Read> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] != Token::Ident("device".into()) {
            i += 1;
            continue;
        }
        // `x.device` would be a field of something else: not worth telling apart.
        if i > 0 && punct(i - 1, '.') {
            return None;
        }
        if !punct(i + 1, '.') {
            return None;
        }
        let field = match tokens.get(i + 2) {
            Some(Token::Ident(f)) => f.as_str(),
            _ => return None,
        };
        match field {
            "driver" | "allowMultipleAllocations" => {
                i += 3;
                continue;
            }
            "attributes" | "capacity" => {}
            _ => return None,
        }
        // `[ "domain" ]`
        if !punct(i + 3, '[') || !punct(i + 5, ']') {
            return None;
        }
        let domain = string(i + 4)?;
        // `.name` (not a method call) or `[ "name" ]`
        let (name, next) = if punct(i + 6, '.') {
            match tokens.get(i + 7) {
                Some(Token::Ident(n)) if !punct(i + 8, '(') => (n.clone(), i + 8),
                _ => return None,
            }
        } else if punct(i + 6, '[') && punct(i + 8, ']') {
            (string(i + 7)?, i + 9)
        } else {
            return None;
        };
        let read = Read {
            capacity: field == "capacity",
            qualified: format!("{domain}/{name}"),
            domain,
            name,
        };
        if !out.contains(&read) {
            out.push(read);
        }
        i = next;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Option<Vec<String>> {
        reads(expr).map(|v| {
            v.into_iter()
                .map(|r| format!("{}{}", if r.capacity { "cap:" } else { "" }, r.qualified))
                .collect()
        })
    }

    #[test]
    fn plain_paths_are_understood() {
        assert_eq!(names("device.driver == \"a\""), Some(vec![]));
        assert_eq!(
            names("device.driver == 'g' && device.attributes[\"g\"].type == \"gpu\""),
            Some(vec!["g/type".into()])
        );
        assert_eq!(
            names(
                "device.attributes['g']['model'].startsWith('x') && device.capacity['g'].memory.compareTo(quantity('1Gi')) >= 0"
            ),
            Some(vec!["g/model".into(), "cap:g/memory".into()])
        );
        assert_eq!(
            names("has(device.attributes[\"g\"].x) && device.attributes[\"g\"].x"),
            Some(vec!["g/x".into()])
        );
        // Text inside strings is not code.
        assert_eq!(
            names("device.driver == \"device.attributes\""),
            Some(vec![])
        );
    }

    #[test]
    fn anything_else_gives_up() {
        for e in [
            "device.attributes[\"g\"].exists(k, k == \"x\")",
            "device.attributes[\"g\"] == {}",
            "\"g\" in device.attributes",
            "device.attributes.exists(d, true)",
            "[1].exists(device, device > 0)",
            "device.attributes[\"g\" + \"\"].x",
            "device.attributes[\"g\"].?x.orValue(1) == 1",
            "device.attributes[\"g\\\"\"].x",
            "device.attributes[r\"g\"].x",
            "device.attributes[\"\"\"g\"\"\"].x",
            "device.driver == \"a\" // device.attributes",
            "(device).driver == \"a\"",
            "device.other",
            "device",
            "x.device.driver",
        ] {
            assert_eq!(reads(e), None, "{e}");
        }
    }
}
