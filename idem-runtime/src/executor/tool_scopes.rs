//! The windows and business-key retentions set at start-up, per tool
//! ([`Executor::with_window`](super::Executor::with_window),
//! [`Executor::with_business_key_retention`](super::Executor::with_business_key_retention)),
//! in place of the attribute's.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use super::ScopeSpec;

/// The longest window or retention a tool may be given: a year. Longer is
/// a unit mistake (seconds read as milliseconds), not a policy.
pub const MAX_TOOL_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// Each tool's window and business-key retention, where start-up set one.
#[derive(Clone, Debug, Default)]
pub(super) struct ToolScopes {
    windows: HashMap<Box<str>, Duration>,
    retentions: HashMap<Box<str>, Duration>,
}

impl ToolScopes {
    /// Sets `tool`'s window, once `window` is judged sane.
    pub(super) fn set_window(&mut self, tool: &str, window: Duration) -> Result<(), ConfigError> {
        check(tool, window, Setting::Window)?;
        self.windows.insert(tool.into(), window);
        Ok(())
    }

    /// Sets `tool`'s business-key retention, once `retention` is judged sane.
    pub(super) fn set_retention(
        &mut self,
        tool: &str,
        retention: Duration,
    ) -> Result<(), ConfigError> {
        check(tool, retention, Setting::Retention)?;
        self.retentions.insert(tool.into(), retention);
        Ok(())
    }

    /// `tool`'s window, if start-up set one.
    pub(super) fn window(&self, tool: &str) -> Option<Duration> {
        self.windows.get(tool).copied()
    }

    /// `tool`'s business-key retention, if start-up set one.
    pub(super) fn retention(&self, tool: &str) -> Option<Duration> {
        self.retentions.get(tool).copied()
    }

    /// `scope`, the attribute's, with `tool`'s settings in place of its
    /// window or retention.
    pub(super) fn apply<'a>(&self, tool: &str, scope: ScopeSpec<'a>) -> ScopeSpec<'a> {
        if self.windows.is_empty() && self.retentions.is_empty() {
            return scope;
        }
        match scope {
            ScopeSpec::Window(window) => ScopeSpec::Window(self.window(tool).unwrap_or(window)),
            ScopeSpec::ClientKey { key, window } => ScopeSpec::ClientKey {
                key,
                window: self.window(tool).unwrap_or(window),
            },
            ScopeSpec::BusinessKey { fields, retention } => ScopeSpec::BusinessKey {
                fields,
                retention: self.retention(tool).or(retention),
            },
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setting {
    Window,
    Retention,
}

fn check(tool: &str, value: Duration, setting: Setting) -> Result<(), ConfigError> {
    if tool.is_empty() {
        return Err(ConfigError {
            message: "a window or retention was set for a tool with an empty name: \
                      pass the tool's name as it is listed (e.g. \"charge_card\")"
                .to_owned(),
        });
    }
    let (what, builder) = match setting {
        Setting::Window => ("window", "with_window"),
        Setting::Retention => ("business-key retention", "with_business_key_retention"),
    };
    if value < Duration::from_secs(1) {
        return Err(ConfigError {
            message: format!(
                "`{tool}`'s {what} was set to {value:?}: a {what} is counted in whole seconds \
                 and must be at least 1 s (a zero {what} would make every repeat run again); \
                 pass a duration of 1 s or more to Executor::{builder}"
            ),
        });
    }
    if value > MAX_TOOL_WINDOW {
        return Err(ConfigError {
            message: format!(
                "`{tool}`'s {what} was set to {} s, more than a year ({} s): this is \
                 usually a unit mistake (milliseconds passed as seconds); pass at most \
                 {} s to Executor::{builder}",
                value.as_secs(),
                MAX_TOOL_WINDOW.as_secs(),
                MAX_TOOL_WINDOW.as_secs()
            ),
        });
    }
    if value.subsec_nanos() != 0 {
        return Err(ConfigError {
            message: format!(
                "`{tool}`'s {what} was set to {value:?}: it is served and listed in whole \
                 seconds; pass a whole number of seconds to Executor::{builder}"
            ),
        });
    }
    Ok(())
}

/// A setting refused at start-up: what was wrong and what to pass instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{ToolScopes, MAX_TOOL_WINDOW};
    use crate::executor::ScopeSpec;

    #[test]
    fn zero_sub_second_and_absurd_values_are_refused_with_what_to_pass() {
        let mut scopes = ToolScopes::default();
        let zero = scopes
            .set_window("charge_card", Duration::ZERO)
            .unwrap_err();
        assert!(
            zero.to_string().contains("`charge_card`'s window"),
            "{zero}"
        );
        assert!(zero.to_string().contains("at least 1 s"), "{zero}");
        let half = scopes
            .set_window("charge_card", Duration::from_millis(1500))
            .unwrap_err();
        assert!(half.to_string().contains("whole"), "{half}");
        let year = scopes
            .set_retention("book", MAX_TOOL_WINDOW + Duration::from_secs(1))
            .unwrap_err();
        assert!(year.to_string().contains("unit mistake"), "{year}");
        assert!(scopes.set_window("", Duration::from_secs(1)).is_err());
        assert_eq!(scopes.window("charge_card"), None);
        assert_eq!(scopes.retention("book"), None);
    }

    #[test]
    fn a_tools_setting_replaces_the_attributes_and_no_other_tools() {
        let mut scopes = ToolScopes::default();
        scopes
            .set_window("charge_card", Duration::from_secs(60))
            .unwrap();
        scopes
            .set_retention("book", Duration::from_secs(3600))
            .unwrap();
        let attr = ScopeSpec::Window(Duration::from_secs(900));
        assert!(matches!(
            scopes.apply("charge_card", attr),
            ScopeSpec::Window(w) if w == Duration::from_secs(60)
        ));
        assert!(matches!(
            scopes.apply("refund", attr),
            ScopeSpec::Window(w) if w == Duration::from_secs(900)
        ));
        let keyed = ScopeSpec::ClientKey {
            key: "k",
            window: Duration::from_secs(900),
        };
        assert!(matches!(
            scopes.apply("charge_card", keyed),
            ScopeSpec::ClientKey { window, .. } if window == Duration::from_secs(60)
        ));
        let business = ScopeSpec::BusinessKey {
            fields: &["order_id"],
            retention: None,
        };
        assert!(matches!(
            scopes.apply("book", business),
            ScopeSpec::BusinessKey { retention: Some(r), .. } if r == Duration::from_secs(3600)
        ));
    }
}
