//! Policy specs as users write them: `NAME` or `NAME:OPTIONS` (`docs/interface.md`).

use crate::error::{quoted, Error, Result};

/// A parsed `--policy` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySpec {
    /// The policy name, e.g. `buddy`.
    pub name: String,
    /// Everything after the first `:`, in the policy's own syntax (may be empty).
    pub options: String,
}

impl PolicySpec {
    /// Parses `NAME[:OPTIONS]`. `all` expands to every built-in policy with its defaults.
    pub fn parse_list(text: &str) -> Result<Vec<PolicySpec>> {
        let text = text.trim();
        if text == "all" {
            return Ok(super::POLICIES
                .iter()
                .map(|p| PolicySpec { name: p.name.into(), options: String::new() })
                .collect());
        }
        let (name, options) = match text.split_once(':') {
            Some((n, o)) => (n.trim(), o.trim()),
            None => (text, ""),
        };
        if name.is_empty() {
            return Err(Error::usage(format!(
                "invalid policy spec {text}: expected NAME or NAME:OPTIONS",
                text = quoted(text)
            )));
        }
        super::lookup(name)?;
        Ok(vec![PolicySpec { name: name.to_string(), options: options.to_string() }])
    }

    /// Parses several `--policy` values, expanding `all`; the default is `pytorch`.
    pub fn parse_many(values: &[String]) -> Result<Vec<PolicySpec>> {
        if values.is_empty() {
            return Self::parse_list("pytorch");
        }
        let mut out = Vec::new();
        for v in values {
            out.extend(Self::parse_list(v)?);
        }
        Ok(out)
    }

    /// `written` (specs as typed, `{a,b}` alternatives and `all` allowed; empty: `default`) with
    /// fragsim's `version=V` added to each PyTorch spec: what `--pytorch-version V` asks of every
    /// command that replays (docs/interface.md, "PyTorch versions"). Other policies are left as
    /// they are; a PyTorch spec that names another version, or a list with no PyTorch spec, is
    /// a usage error (the flag would change nothing the user could see).
    pub fn at_version(written: &[String], default: &[&str], version: &str) -> Result<Vec<String>> {
        let asked = crate::policy::pytorch::config::Version::parse(version)?;
        let given: Vec<String> = if written.is_empty() {
            default.iter().map(|s| s.to_string()).collect()
        } else {
            written.to_vec()
        };
        let mut out = Vec::with_capacity(given.len());
        let mut any = false;
        for text in &given {
            if text.trim() == "all" {
                let all = Self::parse_list("all")?;
                out.extend(all.iter().map(|s| s.display()));
                continue;
            }
            out.push(text.trim().to_string());
        }
        for text in &mut out {
            let (name, options) = match text.split_once(':') {
                Some((n, o)) => (n.trim().to_string(), o.trim().to_string()),
                None => (text.clone(), String::new()),
            };
            if !super::has_allocator_settings(&name) {
                continue;
            }
            any = true;
            if let Some(named) = crate::policy::pytorch::config::top_level_parts(&options)
                .into_iter()
                .find_map(|part| part.trim().strip_prefix("version=").map(str::to_string))
            {
                if crate::policy::pytorch::config::Version::parse(&named).ok() == Some(asked) {
                    continue;
                }
                return Err(Error::usage(format!(
                    "--pytorch-version {version} and version={named} in {spec}: give the \
                     version once",
                    spec = quoted(text)
                )));
            }
            *text = match options.is_empty() {
                true => format!("{name}:version={asked}"),
                false => format!("{name}:{options},version={asked}"),
            };
        }
        if !any {
            return Err(Error::usage(format!(
                "--pytorch-version models a PyTorch release, and none of the policies given \
                 ({}) is PyTorch's: add -p pytorch",
                out.join(", ")
            )));
        }
        Ok(out)
    }

    /// The spec as a user would write it.
    pub fn display(&self) -> String {
        if self.options.is_empty() {
            self.name.clone()
        } else {
            format!("{}:{}", self.name, self.options)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_name_and_options() {
        let s = PolicySpec::parse_list("pytorch:expandable_segments:True,max_split_size_mb:128")
            .unwrap();
        assert_eq!(s[0].name, "pytorch");
        assert_eq!(s[0].options, "expandable_segments:True,max_split_size_mb:128");
        assert_eq!(
            PolicySpec::parse_list("buddy:min_block=512").unwrap()[0].options,
            "min_block=512"
        );
    }

    #[test]
    fn all_expands_and_unknown_names_list_the_accepted_ones() {
        assert_eq!(PolicySpec::parse_list("all").unwrap().len(), super::super::POLICIES.len());
        let err = PolicySpec::parse_list("tlsf").unwrap_err().to_string();
        assert!(
            err.contains("unknown policy 'tlsf'") && err.contains("buddy") && err.contains("all"),
            "{err}"
        );
        assert!(!err.contains("did you mean"), "nothing near 'tlsf': {err}");
    }

    #[test]
    fn a_typo_gets_the_policy_it_is_near() {
        let err = |name: &str| PolicySpec::parse_list(name).unwrap_err().to_string();
        assert!(err("pytoch").contains("unknown policy 'pytoch': did you mean 'pytorch'?"));
        assert!(err("bfcc").contains("did you mean 'bfc'?"), "{}", err("bfcc"));
        assert!(err("Buddy").contains("did you mean 'buddy'?"), "{}", err("Buddy"));
        assert!(err("pytorch-expandabel").contains("did you mean 'pytorch-expandable'?"));
    }
}
