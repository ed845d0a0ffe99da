//! Just enough YAML to read the ResourceSlices that the node agent publishes
//! (`crates/dra-node-agent/profiles/slices/*.yaml`) as data: block mappings and sequences,
//! plain and quoted scalars, `---` between documents. The allocator crate does not depend
//! on the agent, and a YAML crate would be its only use here; this covers what the
//! agent's golden files contain and panics on anything else.
#![allow(dead_code)]

use serde_json::{Map, Value};

/// Every document of a multi-document YAML text, as JSON values.
pub fn documents(text: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    let mut lines: Vec<(usize, String)> = Vec::new();
    for raw in text.lines().chain(std::iter::once("---")) {
        if raw.trim_end() == "---" {
            if !lines.is_empty() {
                let mut i = 0;
                let indent = lines[0].0;
                docs.push(block(&mut lines, &mut i, indent));
                assert_eq!(i, lines.len(), "unparsed YAML at line {:?}", lines.get(i));
                lines.clear();
            }
            continue;
        }
        let content = raw.trim_start();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        assert!(!raw.starts_with('\t'), "tabs in YAML indentation: {raw:?}");
        lines.push((raw.len() - content.len(), content.trim_end().to_string()));
    }
    docs
}

fn is_item(content: &str) -> bool {
    content == "-" || content.starts_with("- ")
}

/// The block that starts at line `i` with indentation `indent`.
fn block(lines: &mut [(usize, String)], i: &mut usize, indent: usize) -> Value {
    if is_item(&lines[*i].1) {
        let mut items = Vec::new();
        while *i < lines.len() && lines[*i].0 == indent && is_item(&lines[*i].1) {
            let after_dash = &lines[*i].1[1..];
            let rest = after_dash.trim_start().to_string();
            let inner = indent + 1 + (after_dash.len() - rest.len());
            if rest.is_empty() {
                *i += 1;
                if *i < lines.len() && lines[*i].0 > indent {
                    let inner = lines[*i].0;
                    items.push(block(lines, i, inner));
                } else {
                    items.push(Value::Null);
                }
            } else {
                // "- key: value" opens a mapping (or a scalar) where `key` starts.
                lines[*i] = (inner, rest);
                if key_value(&lines[*i].1).is_some() {
                    items.push(block(lines, i, inner));
                } else {
                    items.push(scalar(&lines[*i].1));
                    *i += 1;
                }
            }
        }
        return Value::Array(items);
    }
    let mut map = Map::new();
    while *i < lines.len() && lines[*i].0 == indent && !is_item(&lines[*i].1) {
        let (key, value) = key_value(&lines[*i].1)
            .unwrap_or_else(|| panic!("expected `key: value`, got {:?}", lines[*i].1));
        *i += 1;
        let v = if !value.is_empty() {
            scalar(&value)
        } else if *i < lines.len()
            && (lines[*i].0 > indent || (lines[*i].0 == indent && is_item(&lines[*i].1)))
        {
            let inner = lines[*i].0;
            block(lines, i, inner)
        } else {
            Value::Null
        };
        map.insert(key, v);
    }
    Value::Object(map)
}

/// `key: value` or `key:`; None for a line that is not a mapping entry.
fn key_value(content: &str) -> Option<(String, String)> {
    if content.starts_with('\'') || content.starts_with('"') {
        return None;
    }
    let (key, value) = match content.find(": ") {
        Some(p) => (&content[..p], content[p + 2..].trim()),
        None => (content.strip_suffix(':')?, ""),
    };
    Some((key.to_string(), value.to_string()))
}

fn scalar(s: &str) -> Value {
    if let Some(inner) = s.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        return Value::String(inner.replace("''", "'"));
    }
    if s.starts_with('"') {
        return serde_json::from_str(s).unwrap_or_else(|e| panic!("YAML string {s:?}: {e}"));
    }
    match s {
        "{}" => return Value::Object(Map::new()),
        "[]" => return Value::Array(Vec::new()),
        "null" | "~" => return Value::Null,
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    assert!(
        !s.starts_with(['{', '[', '&', '*', '|', '>', '!']),
        "unsupported YAML: {s:?}"
    );
    match s.parse::<i64>() {
        Ok(n) => Value::from(n),
        Err(_) => Value::String(s.to_string()),
    }
}
