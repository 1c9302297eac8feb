//! `by_construction`: the hint and the reason on the tool, the method left
//! as written (sync or async, any receiver rmcp takes), no status tool.
mod common;
use common::*;

use idem_runtime::{
    audit_hints,
    mcp::{hint_report, HintBacking, TOOL_META_KEY},
};
use rmcp::model::MetaObject;

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(
        by_construction = "sets the nickname to the given value; a repeat writes the same value"
    )]
    #[tool(description = "Set a card's nickname")]
    async fn set_nickname(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<String, ToolError> {
        Ok(args.card)
    }

    #[idempotent(by_construction = "deletes by id; a second delete finds nothing")]
    #[tool(
        description = "Forget a card",
        annotations(title = "Forget", destructive_hint = true),
        meta = MetaObject::new()
    )]
    fn forget_card(&self) -> String {
        "forgotten".to_owned()
    }
}

fn main() {
    let router = Shop::tool_router();
    // Only tools idempotent by construction: no operation, no status tool.
    assert!(!router.map.contains_key("get_operation_status"));
    let tool = &router.map["set_nickname"].attr;
    assert_eq!(
        tool.annotations.as_ref().unwrap().idempotent_hint,
        Some(true)
    );
    let marker = tool.meta.as_ref().unwrap().get(TOOL_META_KEY).unwrap();
    assert_eq!(
        marker
            .get("byConstruction")
            .and_then(|reason| reason.as_str()),
        Some("sets the nickname to the given value; a repeat writes the same value")
    );
    assert!(marker.get("statusTool").is_none(), "{marker}");
    let forget = &router.map["forget_card"].attr;
    let annotations = forget.annotations.as_ref().unwrap();
    assert_eq!(annotations.idempotent_hint, Some(true));
    assert_eq!(annotations.destructive_hint, Some(true));
    audit_hints(&router).expect("a hint by construction is backed");
    assert_eq!(
        hint_report(&router),
        vec![
            HintBacking::ByConstruction {
                tool: "forget_card".to_owned(),
                reason: "deletes by id; a second delete finds nothing".to_owned(),
            },
            HintBacking::ByConstruction {
                tool: "set_nickname".to_owned(),
                reason: "sets the nickname to the given value; a repeat writes the same value"
                    .to_owned(),
            },
        ]
    );
    let _ = shop();
}
