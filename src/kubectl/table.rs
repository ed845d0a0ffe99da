//! Tables as kubectl prints them: uppercase headers, columns left-aligned and three spaces
//! apart (kubectl's tabwriter: padding 3), the last column not padded, `<none>` for an
//! empty cell.

/// Rows under headers, rendered with [`Table::render`].
#[derive(Clone, Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// What kubectl prints for a value that is not there.
pub const NONE: &str = "<none>";

/// The items joined with `,`, or [`NONE`].
pub fn list<T: AsRef<str>>(items: &[T]) -> String {
    if items.is_empty() {
        NONE.to_string()
    } else {
        items
            .iter()
            .map(|s| s.as_ref())
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.to_uppercase()).collect(),
            rows: Vec::new(),
        }
    }

    /// A row of as many cells as there are headers; an empty cell prints as [`NONE`].
    pub fn push(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len(), "{cells:?}");
        let cells = cells
            .into_iter()
            .map(|c| if c.is_empty() { NONE.to_string() } else { c })
            .collect();
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let width = |i: usize| {
            std::iter::once(&self.headers)
                .chain(&self.rows)
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.headers.len()).map(width).collect();
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                line.push_str(cell);
                if i + 1 < row.len() {
                    let pad = widths[i] - cell.chars().count() + 3;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_aligned_three_spaces_apart_with_uppercase_headers() {
        let mut t = Table::new(&["name", "state"]);
        t.push(vec!["a-long-name".into(), "reserved".into()]);
        t.push(vec!["b".into(), String::new()]);
        assert_eq!(
            t.render(),
            "NAME          STATE\na-long-name   reserved\nb             <none>\n"
        );
    }

    #[test]
    fn an_empty_list_is_none() {
        assert_eq!(list::<&str>(&[]), "<none>");
        assert_eq!(list(&["a", "b"]), "a,b");
    }
}
