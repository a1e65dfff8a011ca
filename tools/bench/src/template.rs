//! A small renderer for the report's markdown templates (`templates/*.md`).
//!
//! The templates hold the report's text; the code computes the figures
//! and hands them over as named values ([`Vars`]). The syntax:
//!
//! - `{{name}}`: the text of `name`, inserted as it is (never re-read as
//!   a template, so figures and error messages may hold braces);
//! - `{{> name}}`: the same for a block of whole lines (rows or a section
//!   rendered elsewhere); on a line of its own it takes the line's place;
//! - `{{#each name}} … {{/each}}`: the inside once per entry of the list
//!   `name`, each entry's values shadowing the outer ones (a table's rows);
//! - `{{#if name}} … {{/if}}` and `{{#unless name}} … {{/unless}}`: the
//!   inside when the flag `name` is set (or not); a list counts as set
//!   when it has entries, a text when it is not empty;
//! - `{{! comment }}`: nothing.
//!
//! A block tag (`#`, `/`, `>`, `!`) alone on its line takes the line with
//! it, so that blocks can be written one tag a line without leaving empty
//! lines behind. A name the values do not hold is an error, not an empty
//! text: the unit tests render every template with sample figures, so a
//! misspelt name fails there.

use std::collections::BTreeMap;
use std::fmt::Display;

/// Why a template could not be rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// `{{` without its `}}`.
    #[error("template: unclosed tag at byte {0}")]
    Unclosed(usize),
    /// A block closed by the wrong tag, or never closed.
    #[error("template: block {open:?} closed by {close:?}")]
    Mismatched {
        /// The tag that opened the block.
        open: String,
        /// The tag that closed it (empty at the end of the template).
        close: String,
    },
    /// A closing tag without an open block.
    #[error("template: {0:?} closes no block")]
    Stray(String),
    /// A tag of no known kind.
    #[error("template: unknown tag {0:?}")]
    Unknown(String),
    /// A name the values do not hold.
    #[error("template: no value named {0:?}")]
    Missing(String),
    /// A value used as the wrong kind (a list as text, text as a list).
    #[error("template: {name:?} is not a {want}")]
    Kind {
        /// The value's name.
        name: String,
        /// What the tag needed.
        want: &'static str,
    },
}

/// One named value.
#[derive(Debug, Clone)]
enum Value {
    Text(String),
    Flag(bool),
    List(Vec<Vars>),
}

/// The named values a template is rendered with.
#[derive(Debug, Clone, Default)]
pub struct Vars {
    values: BTreeMap<String, Value>,
}

impl Vars {
    /// No values.
    pub fn new() -> Vars {
        Vars::default()
    }

    /// Sets `name` to the text of `v`.
    pub fn set(&mut self, name: &str, v: impl Display) -> &mut Vars {
        self.values
            .insert(name.to_string(), Value::Text(v.to_string()));
        self
    }

    /// Sets the flag `name` (for `#if` / `#unless`).
    pub fn flag(&mut self, name: &str, on: bool) -> &mut Vars {
        self.values.insert(name.to_string(), Value::Flag(on));
        self
    }

    /// Sets `name` to a list of entries (for `#each`).
    pub fn list(&mut self, name: &str, rows: Vec<Vars>) -> &mut Vars {
        self.values.insert(name.to_string(), Value::List(rows));
        self
    }
}

/// A parsed template.
#[derive(Debug, PartialEq, Eq)]
enum Node<'t> {
    Text(&'t str),
    Var(&'t str),
    Each(&'t str, Vec<Node<'t>>),
    If(&'t str, bool, Vec<Node<'t>>),
}

/// One tag as written between `{{` and `}}`.
enum Tag<'t> {
    Var(&'t str),
    Block(&'t str),
    Open(&'static str, &'t str),
    Close(&'static str),
    Comment,
}

fn tag(inner: &str) -> Result<Tag<'_>, TemplateError> {
    let t = inner.trim();
    let unknown = || TemplateError::Unknown(t.to_string());
    if t.starts_with('!') {
        return Ok(Tag::Comment);
    }
    if let Some(n) = t.strip_prefix('>') {
        return Ok(Tag::Block(n.trim()));
    }
    if let Some(rest) = t.strip_prefix('#') {
        let (kind, name) = rest.split_once(' ').ok_or_else(unknown)?;
        let kind = match kind {
            "each" => "each",
            "if" => "if",
            "unless" => "unless",
            _ => return Err(unknown()),
        };
        return Ok(Tag::Open(kind, name.trim()));
    }
    if let Some(kind) = t.strip_prefix('/') {
        return match kind.trim() {
            "each" => Ok(Tag::Close("each")),
            "if" => Ok(Tag::Close("if")),
            "unless" => Ok(Tag::Close("unless")),
            _ => Err(unknown()),
        };
    }
    if t.is_empty() || t.contains(char::is_whitespace) {
        return Err(unknown());
    }
    Ok(Tag::Var(t))
}

/// Parses `src` into nodes.
fn parse(src: &str) -> Result<Vec<Node<'_>>, TemplateError> {
    // Open blocks: (kind, name, nodes before the block).
    let mut stack: Vec<(&'static str, &str, Vec<Node<'_>>)> = Vec::new();
    let mut nodes = Vec::new();
    let mut pos = 0;
    while let Some(off) = src[pos..].find("{{") {
        let start = pos + off;
        let end = src[start..]
            .find("}}")
            .map(|e| start + e + 2)
            .ok_or(TemplateError::Unclosed(start))?;
        let t = tag(&src[start + 2..end - 2])?;
        // A block tag alone on its line takes the line's end with it.
        let line_start = start == 0 || src.as_bytes()[start - 1] == b'\n';
        let standalone = !matches!(t, Tag::Var(_)) && line_start && src[end..].starts_with('\n');
        if start > pos {
            nodes.push(Node::Text(&src[pos..start]));
        }
        pos = if standalone { end + 1 } else { end };
        match t {
            Tag::Var(n) => nodes.push(Node::Var(n)),
            Tag::Block(n) => nodes.push(Node::Var(n)),
            Tag::Comment => {}
            Tag::Open(kind, name) => stack.push((kind, name, std::mem::take(&mut nodes))),
            Tag::Close(kind) => {
                let (open, name, before) = stack
                    .pop()
                    .ok_or_else(|| TemplateError::Stray(kind.to_string()))?;
                if open != kind {
                    return Err(TemplateError::Mismatched {
                        open: format!("#{open} {name}"),
                        close: format!("/{kind}"),
                    });
                }
                let inner = std::mem::replace(&mut nodes, before);
                nodes.push(match kind {
                    "each" => Node::Each(name, inner),
                    _ => Node::If(name, kind == "unless", inner),
                });
            }
        }
    }
    if pos < src.len() {
        nodes.push(Node::Text(&src[pos..]));
    }
    if let Some((open, name, _)) = stack.pop() {
        return Err(TemplateError::Mismatched {
            open: format!("#{open} {name}"),
            close: String::new(),
        });
    }
    Ok(nodes)
}

/// Finds `name` in the innermost scope that has it.
fn lookup<'v>(scopes: &[&'v Vars], name: &str) -> Result<&'v Value, TemplateError> {
    scopes
        .iter()
        .rev()
        .find_map(|s| s.values.get(name))
        .ok_or_else(|| TemplateError::Missing(name.to_string()))
}

fn emit(
    out: &mut String,
    nodes: &[Node<'_>],
    scopes: &mut Vec<&Vars>,
) -> Result<(), TemplateError> {
    for n in nodes {
        match n {
            Node::Text(t) => out.push_str(t),
            Node::Var(name) => match lookup(scopes, name)? {
                Value::Text(t) => out.push_str(t),
                _ => {
                    return Err(TemplateError::Kind {
                        name: name.to_string(),
                        want: "text",
                    })
                }
            },
            Node::Each(name, inner) => {
                let Value::List(rows) = lookup(scopes, name)? else {
                    return Err(TemplateError::Kind {
                        name: name.to_string(),
                        want: "list",
                    });
                };
                for row in rows {
                    scopes.push(row);
                    let r = emit(out, inner, scopes);
                    scopes.pop();
                    r?;
                }
            }
            Node::If(name, negate, inner) => {
                let on = match lookup(scopes, name)? {
                    Value::Flag(b) => *b,
                    Value::List(l) => !l.is_empty(),
                    Value::Text(t) => !t.is_empty(),
                };
                if on != *negate {
                    emit(out, inner, scopes)?;
                }
            }
        }
    }
    Ok(())
}

/// Renders `template` with `vars`.
pub fn render(template: &str, vars: &Vars) -> Result<String, TemplateError> {
    let nodes = parse(template)?;
    let mut out = String::with_capacity(template.len() * 2);
    emit(&mut out, &nodes, &mut vec![vars])?;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn render_should_fill_placeholders_and_keep_other_text() {
        let mut v = Vars::new();
        v.set("p50", "1.234").set("n", 7);
        let out = render("| a {b} | {{p50}} ms | {{ n }} |\n", &v).unwrap();
        assert_eq!(out, "| a {b} | 1.234 ms | 7 |\n");
    }

    #[test]
    fn render_should_not_reread_inserted_text() {
        let mut v = Vars::new();
        v.set("why", "{{x}}");
        assert_eq!(render("[{{why}}]", &v).unwrap(), "[{{x}}]");
    }

    #[test]
    fn render_should_repeat_rows_with_outer_values_visible() {
        let mut v = Vars::new();
        let rows = ["a", "b"]
            .iter()
            .map(|n| {
                let mut r = Vars::new();
                r.set("name", n);
                r
            })
            .collect();
        v.set("unit", "ms").list("rows", rows);
        let t = "| h |\n{{#each rows}}\n| {{name}} {{unit}} |\n{{/each}}\nend\n";
        assert_eq!(render(t, &v).unwrap(), "| h |\n| a ms |\n| b ms |\nend\n");
    }

    #[test]
    fn render_should_drop_standalone_block_lines_only() {
        let mut v = Vars::new();
        v.flag("on", true)
            .flag("off", false)
            .set("rows", "r1\nr2\n");
        let t = "a\n{{#if on}}\nyes\n{{/if}}\n{{#if off}}\nno\n{{/if}}\n{{#unless off}}x{{/unless}}\n{{> rows}}\n{{! note }}\nz";
        assert_eq!(render(t, &v).unwrap(), "a\nyes\nx\nr1\nr2\nz");
    }

    #[test]
    fn render_should_treat_lists_and_texts_as_flags() {
        let mut v = Vars::new();
        v.list("none", vec![]).set("empty", "").set("full", "f");
        let t = "{{#if none}}1{{/if}}{{#if empty}}2{{/if}}{{#if full}}3{{/if}}";
        assert_eq!(render(t, &v).unwrap(), "3");
    }

    #[test]
    fn render_should_reject_missing_names_and_broken_blocks() {
        let v = Vars::new();
        assert_eq!(
            render("{{nope}}", &v),
            Err(TemplateError::Missing("nope".into()))
        );
        assert!(matches!(
            render("{{#each r}}x", &v),
            Err(TemplateError::Mismatched { .. })
        ));
        assert!(matches!(
            render("{{#if r}}x{{/each}}", &v),
            Err(TemplateError::Mismatched { .. })
        ));
        assert_eq!(
            render("{{/if}}", &v),
            Err(TemplateError::Stray("if".into()))
        );
        assert_eq!(render("a {{b", &v), Err(TemplateError::Unclosed(2)));
        assert!(matches!(
            render("{{#loop r}}{{/loop}}", &v),
            Err(TemplateError::Unknown(_))
        ));
    }

    #[test]
    fn render_should_reject_a_value_of_the_wrong_kind() {
        let mut v = Vars::new();
        v.set("t", "x").list("l", vec![]);
        assert!(matches!(
            render("{{#each t}}{{/each}}", &v),
            Err(TemplateError::Kind { .. })
        ));
        assert!(matches!(
            render("{{l}}", &v),
            Err(TemplateError::Kind { .. })
        ));
    }
}
