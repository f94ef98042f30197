//! A plain-text table with aligned columns, and digit grouping for large integers.

/// Columns of text, left-aligned unless marked right-aligned, padded to the widest cell.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    right: Vec<bool>,
    show_header: bool,
}

impl Table {
    /// A table with these column titles (made [`crate::terminal_safe`], as every cell is).
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| crate::terminal_safe(s).into_owned()).collect(),
            rows: Vec::new(),
            right: vec![false; header.len()],
            show_header: true,
        }
    }

    /// Right-aligns the given columns (numbers).
    pub fn right_align(mut self, columns: &[usize]) -> Table {
        for &c in columns {
            if let Some(flag) = self.right.get_mut(c) {
                *flag = true;
            }
        }
        self
    }

    /// Leaves the titles out (a table of label–value rows).
    pub fn without_header(mut self) -> Table {
        self.show_header = false;
        self
    }

    /// Adds a row, one cell per column, each made [`crate::terminal_safe`] before the columns
    /// are measured (a cell may quote a name from an input file).
    pub fn row(&mut self, cells: &[&str]) {
        self.rows.push(cells.iter().map(|s| crate::terminal_safe(s).into_owned()).collect());
    }

    /// The table as text, columns padded to their widest cell.
    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths = vec![0usize; columns];
        let lines = self.show_header.then_some(&self.header).into_iter().chain(self.rows.iter());
        for row in lines.clone() {
            for (c, cell) in row.iter().enumerate().take(columns) {
                widths[c] = widths[c].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in lines {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate().take(columns) {
                let pad = widths[c] - cell.chars().count();
                if c > 0 {
                    line.push_str("  ");
                }
                if self.right[c] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `1234567` → `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_group_in_threes() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(46_702_792_704), "46,702,792,704");
    }

    #[test]
    fn columns_align() {
        let mut t = Table::new(&["a", "n"]).right_align(&[1]);
        t.row(&["long name", "1"]);
        t.row(&["x", "1000"]);
        assert_eq!(t.render(), "a             n\nlong name     1\nx          1000\n");
    }
}
