//! The README's start-up audit from `main` when the server lives in a
//! module of its own: `#[idem_runtime::tool_router(vis = "pub(crate)")]`
//! makes `tool_router()` callable from outside the module (rmcp's default
//! is private to it), and the audit finds every hint backed.

mod shop {
    use std::sync::Arc;

    use idem_runtime::{idempotent, Executor, IdempotentServer, MemoryStore, ToolError};
    use rmcp::handler::server::wrapper::Parameters;
    use rmcp::tool;

    #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
    pub struct ChargeArgs {
        pub cents: u64,
    }

    pub struct Shop {
        executor: Executor,
    }

    impl Shop {
        pub fn new() -> Self {
            Shop {
                executor: Executor::new(Arc::new(MemoryStore::new())),
            }
        }
    }

    impl IdempotentServer for Shop {
        fn executor(&self) -> &Executor {
            &self.executor
        }
    }

    #[idem_runtime::tool_router(vis = "pub(crate)")]
    impl Shop {
        #[idempotent(window = "15m", client_key = "optional")]
        #[tool(description = "Charge a card")]
        async fn charge(
            &self,
            Parameters(args): Parameters<ChargeArgs>,
        ) -> Result<String, ToolError> {
            Ok(format!("charged {}", args.cents))
        }
    }
}

#[test]
fn main_audits_a_router_of_another_module() {
    let router = shop::Shop::tool_router();
    let _server = shop::Shop::new();
    assert_eq!(idem_runtime::audit_hints(&router), Ok(()));
    let names: Vec<String> = router
        .list_all()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(names.contains(&"charge".to_owned()), "{names:?}");
    assert!(
        names.contains(&"get_operation_status".to_owned()),
        "{names:?}"
    );
}
