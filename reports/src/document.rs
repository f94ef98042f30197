//! `vramplan report`'s documents: sections of a heading, a table and a drawing, written as
//! Markdown (the drawings as SVG files beside it, linked by name) or as one self-contained HTML
//! file (the drawings inline, no script, no stylesheet from the network) that opens offline.
//! Nothing in either depends on the time or the machine: the same sections give the same bytes.

/// One section of a report.
#[derive(Debug, Clone)]
pub struct Section {
    /// Its heading.
    pub heading: String,
    /// A sentence or two above the table.
    pub lead: String,
    /// The table, as the command line prints it (monospaced).
    pub table: String,
    /// The drawing under it.
    pub drawing: Option<Drawing>,
}

/// A drawing of a section.
#[derive(Debug, Clone)]
pub struct Drawing {
    /// The SVG file's name beside a Markdown report.
    pub file: String,
    /// Its alternative text.
    pub caption: String,
    /// The SVG.
    pub svg: String,
}

/// The report as Markdown: the drawings are linked by their file names (written beside it).
pub fn markdown(title: &str, sections: &[Section]) -> String {
    let mut text = format!("# {title}\n");
    for section in sections {
        text += &format!("\n## {}\n\n", section.heading);
        if !section.lead.is_empty() {
            text += &format!("{}\n\n", section.lead);
        }
        text += &format!("```text\n{}\n```\n", section.table.trim_end());
        if let Some(d) = &section.drawing {
            text += &format!("\n![{}]({})\n", d.caption.replace(['[', ']'], ""), d.file);
        }
    }
    // Names from input files reach the document escaped, as they reach a terminal.
    crate::terminal_safe(&text).into_owned()
}

/// The report as one HTML file, the drawings inline.
pub fn html(title: &str, sections: &[Section]) -> String {
    let mut text = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>\n\
         body {{ font-family: sans-serif; max-width: 1400px; margin: 2em auto; padding: 0 1em; color: #222; }}\n\
         pre {{ background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 13px; }}\n\
         figure {{ margin: 1em 0; overflow-x: auto; }}\n</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        escape(title),
        escape(title)
    );
    for section in sections {
        text += &format!("<h2>{}</h2>\n", escape(&section.heading));
        if !section.lead.is_empty() {
            text += &format!("<p>{}</p>\n", escape(&section.lead));
        }
        text += &format!("<pre>{}</pre>\n", escape(section.table.trim_end()));
        if let Some(d) = &section.drawing {
            let svg = d.svg.trim_start_matches(|c| c != '<');
            text +=
                &format!("<figure aria-label=\"{}\">\n{}\n</figure>\n", escape(&d.caption), svg.trim_end());
        }
    }
    // Names from input files reach the page escaped: HTML does not allow control characters.
    crate::terminal_safe(&(text + "</body>\n</html>\n")).into_owned()
}

/// `text` with HTML's special characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sections() -> Vec<Section> {
        vec![Section {
            heading: "Memory <at> the peak".into(),
            lead: "a & b".into(),
            table: "GPU 0  fits\n".into(),
            drawing: Some(Drawing {
                file: "r-breakdown.svg".into(),
                caption: "bars".into(),
                svg: "<svg></svg>".into(),
            }),
        }]
    }

    #[test]
    fn markdown_links_the_drawing_and_html_inlines_it_escaped() {
        let md = markdown("t", &sections());
        assert!(md.contains("## Memory <at> the peak") && md.contains("![bars](r-breakdown.svg)"));
        assert!(md.contains("```text\nGPU 0  fits\n```"));
        let page = html("t", &sections());
        assert!(page.contains("<h2>Memory &lt;at&gt; the peak</h2>") && page.contains("<p>a &amp; b</p>"));
        assert!(page.contains("<svg></svg>") && !page.contains("r-breakdown.svg"));
        assert!(!page.contains("<script") && !page.contains("http"));
    }
}
