//! YAML text to JSON values, within [`super::limits`]: a stream is split into its documents
//! and each is measured before the parser sees it, and the parsed tree is built under a
//! depth and a size budget, so no input makes parsing slow or large.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::ops::Range;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::limits::{MAX_DEPTH, MAX_VALUES_PER_BYTE};

/// One document's text in the stream: its byte range and the line it starts on (1-based).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentText {
    pub range: Range<usize>,
    pub first_line: usize,
}

fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']))
}

/// The documents of a YAML stream, where YAML puts their boundaries: a `---` line starts one
/// (also inside a block scalar, where YAML forbids it as content), a `...` line ends one, and
/// text before the first marker is a document when it holds more than comments and
/// directives. These are the documents the parser yields, in the same order.
pub fn split_documents(text: &str) -> Vec<DocumentText> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut first_line = 1;
    // Whether the current piece is a document yet: it has content or an explicit `---`.
    let mut is_document = false;
    let mut offset = 0;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let line_no = index + 1;
        let line_start = offset;
        offset += line.len();
        if is_marker(line, "---") {
            if is_document {
                out.push(DocumentText {
                    range: start..line_start,
                    first_line,
                });
                start = line_start;
                first_line = line_no;
            }
            is_document = true;
        } else if is_marker(line, "...") {
            if is_document {
                out.push(DocumentText {
                    range: start..offset,
                    first_line,
                });
                is_document = false;
            }
            start = offset;
            first_line = line_no + 1;
        } else if !is_document {
            let trimmed = line.trim();
            if !trimmed.is_empty() && !trimmed.starts_with('#') && !line.starts_with('%') {
                is_document = true;
            }
        }
    }
    if is_document {
        out.push(DocumentText {
            range: start..text.len(),
            first_line,
        });
    }
    out
}

/// A block scalar (`|` or `>`) being skipped: its lines are text, not YAML.
struct BlockScalar {
    /// Lines indented at least this much belong to it; found from its first line if unset.
    indent: Option<usize>,
    /// The least indentation its content may have.
    min_indent: usize,
}

/// The deepest nesting of flow collections (`[`, `{`) in one document's text and the line
/// (1-based, within the text) where it is first reached past `limit`, if it is. Quoted
/// scalars, comments and block scalars are skipped as the YAML scanner skips them; a bracket
/// inside a plain scalar of block context is text, as in YAML. The scan is linear, so
/// rejecting `[[[[...` costs microseconds where the parser would take seconds.
pub fn flow_depth_exceeds(text: &str, limit: usize) -> Option<usize> {
    let mut flow = 0usize;
    let mut quote: Option<u8> = None;
    let mut block: Option<BlockScalar> = None;
    for (index, line) in text.lines().enumerate() {
        let bytes = line.as_bytes();
        let indent = bytes.iter().take_while(|b| **b == b' ').count();
        if let Some(b) = &mut block {
            if bytes[indent..].iter().all(|c| c.is_ascii_whitespace()) {
                continue;
            }
            let inside = match b.indent {
                Some(i) => indent >= i,
                None if indent >= b.min_indent => {
                    b.indent = Some(indent);
                    true
                }
                None => false,
            };
            if inside && !is_marker(line, "---") && !is_marker(line, "...") {
                continue;
            }
            block = None;
        }
        let mut i = 0;
        // A node may start here: at the start of a line in block context, after `- `, `? `,
        // `: `, a flow indicator or a node property.
        let mut node_start = flow == 0;
        // Column of the block node the line's last token belongs to (a block scalar's
        // content must be indented more than it).
        let mut node_column = indent;
        if flow == 0 && quote.is_none() && (is_marker(line, "---") || is_marker(line, "...")) {
            i = 3;
            node_column = usize::MAX; // top level: content may start in any column
        }
        while i < bytes.len() {
            let c = bytes[i];
            let next = bytes.get(i + 1).copied();
            let blank_next = next.is_none_or(|n| n == b' ' || n == b'\t');
            if let Some(q) = quote {
                if q == b'\'' && c == b'\'' {
                    if next == Some(b'\'') {
                        i += 2;
                        continue;
                    }
                    quote = None;
                } else if q == b'"' && c == b'\\' {
                    i += 2;
                    continue;
                } else if q == b'"' && c == b'"' {
                    quote = None;
                }
                i += 1;
                continue;
            }
            match c {
                b' ' | b'\t' | b'\r' => {}
                b'#' if i == 0 || matches!(bytes[i - 1], b' ' | b'\t') => break,
                b'[' | b'{' if node_start || flow > 0 => {
                    flow += 1;
                    if flow > limit {
                        return Some(index + 1);
                    }
                    node_start = true;
                }
                b']' | b'}' if flow > 0 => {
                    flow -= 1;
                    node_start = false;
                }
                b',' if flow > 0 => node_start = true,
                b'\'' | b'"' if node_start => {
                    quote = Some(c);
                    node_start = false;
                }
                b'-' | b'?' if node_start && blank_next => {
                    if flow == 0 {
                        node_column = i;
                    }
                }
                b':' if blank_next || flow > 0 => node_start = true,
                b'|' | b'>' if node_start && flow == 0 => {
                    let header = &line[i + 1..];
                    let explicit = header
                        .bytes()
                        .find(|b| b.is_ascii_digit())
                        .map(|d| usize::from(d - b'0'));
                    let parent = node_column;
                    let min_indent = if parent == usize::MAX { 1 } else { parent + 1 };
                    block = Some(BlockScalar {
                        indent: explicit.map(|e| if parent == usize::MAX { e } else { parent + e }),
                        min_indent,
                    });
                    break;
                }
                b'&' | b'!' | b'*' if node_start => {
                    // An anchor, tag or alias: one token up to the next blank.
                    while i < bytes.len() && !matches!(bytes[i], b' ' | b'\t') {
                        if flow > 0 && matches!(bytes[i], b',' | b']' | b'}') {
                            break;
                        }
                        i += 1;
                    }
                    if c == b'*' {
                        node_start = false;
                    }
                    continue;
                }
                _ => {
                    if node_start && flow == 0 {
                        node_column = i;
                    }
                    node_start = false;
                }
            }
            i += 1;
        }
    }
    None
}

/// What building one document's value may still spend.
pub struct Budget {
    values: Cell<usize>,
    limit: usize,
    /// Why building stopped, when a limit here stopped it: the parser wraps the message
    /// with the path of keys to the value (a hundred of them, for a deep document).
    failure: RefCell<Option<String>>,
}

impl Budget {
    /// The budget for a document of `bytes` bytes.
    pub fn for_document(bytes: usize) -> Budget {
        let limit = bytes
            .saturating_mul(MAX_VALUES_PER_BYTE)
            .saturating_add(1024);
        Budget {
            values: Cell::new(limit),
            limit,
            failure: RefCell::new(None),
        }
    }

    /// The message of the limit that stopped building, if one did.
    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }

    fn fail<E: de::Error>(&self, message: String) -> E {
        let error = E::custom(&message);
        *self.failure.borrow_mut() = Some(message);
        error
    }

    fn spend<E: de::Error>(&self) -> Result<(), E> {
        match self.values.get().checked_sub(1) {
            Some(left) => {
                self.values.set(left);
                Ok(())
            }
            None => Err(self.fail(format!(
                "the document expands to more than {} values, more than {MAX_VALUES_PER_BYTE} \
                 per byte of its text (YAML aliases repeating large parts of it?)",
                self.limit
            ))),
        }
    }
}

/// Deserialize one YAML document as a JSON value within `budget` and [`MAX_DEPTH`].
pub struct ValueSeed<'b> {
    pub budget: &'b Budget,
    pub depth: usize,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.budget.spend()?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.budget.spend()?;
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.budget.spend()?;
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.budget.spend()?;
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("{v} is not a number JSON can hold")))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.budget.spend()?;
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.budget.spend()?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.budget.spend()?;
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.budget.spend()?;
        let depth = nested::<A::Error>(self.budget, self.depth)?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(ValueSeed {
            budget: self.budget,
            depth,
        })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.budget.spend()?;
        let depth = nested::<A::Error>(self.budget, self.depth)?;
        let mut out = Map::new();
        while let Some(key) = map.next_key_seed(KeySeed(self.budget))? {
            let value = map.next_value_seed(ValueSeed {
                budget: self.budget,
                depth,
            })?;
            if out.contains_key(&key) {
                return Err(self.budget.fail(format!("duplicate key {key:?}")));
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Value, A::Error> {
        // serde_yaml hands a node with a custom tag (`!Ref x`) over as an enum.
        let (tag, _) = data.variant::<String>()?;
        Err(self.budget.fail(format!(
            "the YAML tag !{tag} is not supported (Kubernetes objects use none)"
        )))
    }
}

fn nested<E: de::Error>(budget: &Budget, depth: usize) -> Result<usize, E> {
    if depth >= MAX_DEPTH {
        Err(budget.fail(format!(
            "mappings and sequences are nested more than {MAX_DEPTH} levels deep"
        )))
    } else {
        Ok(depth + 1)
    }
}

/// A mapping key: a string, or a number or boolean written as one (as JSON would need).
struct KeySeed<'b>(&'b Budget);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a mapping key that is a string, a number or a boolean")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        self.0.spend()?;
        Ok(v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        self.0.spend()?;
        Ok(v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        self.0.spend()?;
        Ok(v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        self.0.spend()?;
        Ok(v.to_string())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        self.0.spend()?;
        Ok(v.to_string())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        self.0.spend()?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs(text: &str) -> Vec<&str> {
        split_documents(text)
            .into_iter()
            .map(|d| &text[d.range])
            .collect()
    }

    #[test]
    fn documents_split_where_yaml_splits_them() {
        assert_eq!(docs("a: 1\n---\nb: 2\n"), ["a: 1\n", "---\nb: 2\n"]);
        assert_eq!(docs("# c\n---\na: 1\n---\n"), ["# c\n---\na: 1\n", "---\n"]);
        assert_eq!(docs("a\n...\nb\n"), ["a\n...\n", "b\n"]);
        assert_eq!(docs("%YAML 1.2\n---\na\n"), ["%YAML 1.2\n---\na\n"]);
        assert_eq!(
            docs("--- |\n  text\n---x: 1\n"),
            ["--- |\n  text\n---x: 1\n"]
        );
        assert!(docs("# only a comment\n\n").is_empty());
        assert_eq!(split_documents("a\n---\nb\n")[1].first_line, 2);
    }

    #[test]
    fn the_documents_are_the_ones_the_parser_yields() {
        use serde::Deserialize;
        for text in [
            "a: 1\n---\nb: 2\n---\n",
            "# c\n---\n---\na\n...\n---\nb\n",
            "---\n",
            "x: |\n  ---not a marker\n---\ny\n",
        ] {
            let mut parsed = 0;
            for document in serde_yaml::Deserializer::from_str(text) {
                serde_yaml::Value::deserialize(document).unwrap();
                parsed += 1;
            }
            assert_eq!(split_documents(text).len(), parsed, "{text:?}");
        }
        // An empty stream is one empty document to the parser, and none here: nothing to
        // measure either way.
        assert!(split_documents("").is_empty());
    }

    #[test]
    fn flow_depth_counts_brackets_that_open_collections() {
        let deep = "[".repeat(101);
        assert_eq!(flow_depth_exceeds(&deep, 100), Some(1));
        assert_eq!(flow_depth_exceeds(&"[".repeat(100), 100), None);
        assert_eq!(
            flow_depth_exceeds(&format!("a: 1\nb: {deep}"), 100),
            Some(2)
        );
        let json = format!("{}1{}", "{\"a\":".repeat(101), "}".repeat(101));
        assert_eq!(flow_depth_exceeds(&json, 100), Some(1));
        // Text, not collections: quoted, commented, in a plain scalar or a block scalar.
        for text in [
            format!("a: '{deep}'"),
            format!("a: \"{deep}\""),
            format!("a: 1 # {deep}"),
            format!("a: x{deep}"),
            format!("a: it's {deep}"),
            format!("a: |\n  {deep}\n  more\nb: 1"),
            format!("- key: >-\n    {deep}\n"),
            format!("a: \"multi\n  line {deep}\"\nb: 1"),
        ] {
            assert_eq!(flow_depth_exceeds(&text, 100), None, "{text}");
        }
        // A block scalar ends where its indentation does; brackets after it count again.
        let after = format!("- a: |\n    text\n  b: {deep}\n");
        assert_eq!(flow_depth_exceeds(&after, 100), Some(3));
        let sequence = format!("- |\n x\n- {deep}\n");
        assert_eq!(flow_depth_exceeds(&sequence, 100), Some(3));
        let anchored = format!("a: &x {deep}");
        assert_eq!(flow_depth_exceeds(&anchored, 100), Some(1));
    }

    fn parse(text: &str) -> Result<Value, String> {
        let budget = Budget::for_document(text.len());
        let mut docs = serde_yaml::Deserializer::from_str(text);
        let doc = docs.next().unwrap();
        ValueSeed {
            budget: &budget,
            depth: 0,
        }
        .deserialize(doc)
        .map_err(|e| e.to_string())
    }

    #[test]
    fn values_are_json() {
        assert_eq!(
            parse("a: [1, -2, 1.5, true, null, x]\n3: {}\ntrue: y\n").unwrap(),
            serde_json::json!({"a": [1, -2, 1.5, true, null, "x"], "3": {}, "true": "y"})
        );
    }

    #[test]
    fn depth_aliases_tags_and_duplicates_are_errors() {
        let deep = "- ".repeat(MAX_DEPTH + 1);
        let err = parse(&deep).unwrap_err();
        assert!(err.contains("nested more than 100 levels deep"), "{err}");
        assert!(parse(&"- ".repeat(MAX_DEPTH - 1)).is_ok());
        let mut laughs = String::from("a: &a [x, x, x, x, x, x, x, x]\n");
        for i in 0..8 {
            laughs += &format!(
                "b{i}: &b{i} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n",
                p = if i == 0 {
                    "a".to_string()
                } else {
                    format!("b{}", i - 1)
                }
            );
        }
        let err = parse(&laughs).unwrap_err();
        assert!(err.contains("expands to more than"), "{err}");
        assert!(parse("a: &a {x: 1}\nb: *a\n").is_ok());
        let err = parse("a: !Ref x\n").unwrap_err();
        assert!(err.contains("YAML tag !Ref is not supported"), "{err}");
        let err = parse("a: 1\na: 2\n").unwrap_err();
        assert!(err.contains("duplicate"), "{err}");
        assert!(parse("[1, 2]: x\n").is_err());
    }
}
