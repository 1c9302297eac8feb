//! How a statement reaches the server: unnamed by default, so that nothing
//! outlives the statement's own transaction and the store works behind a
//! transaction pooler (PgBouncer in transaction mode, the poolers of
//! Supabase, Neon, Heroku and Azure), or named and cached per connection
//! ([`PostgresStoreBuilder::named_statements`](super::PostgresStoreBuilder::named_statements)),
//! for a direct connection.
//!
//! An unnamed statement is Parse, Bind, Describe, Execute and Sync in one
//! message: one round trip, as a cached named statement's Bind and Execute
//! are, with the server parsing and planning it each time. A named
//! statement lives on one server connection, and a transaction pooler hands
//! the next transaction another one (`prepared statement "s71" does not
//! exist`, or another client's `"s15" already exists`).
//!
//! An unnamed statement carries its parameters' types: each parameter gives
//! its own ([`Param`]), from its Rust type, as the named statement's
//! prepare would have found them.

use deadpool_postgres::Object;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Error, Row};

/// A statement's parameter: a value and its PostgreSQL type.
pub(super) trait Param: ToSql + Sync {
    /// The type the statement is parsed with for this parameter.
    fn pg_type(&self) -> Type;
}

/// The PostgreSQL type of a Rust type the store binds.
trait PgType {
    const TYPE: Type;
}

macro_rules! pg_types {
    ($($rust:ty => $pg:ident,)*) => {
        $(impl PgType for $rust {
            const TYPE: Type = Type::$pg;
        })*
    };
}

pg_types! {
    bool => BOOL,
    i16 => INT2,
    i32 => INT4,
    i64 => INT8,
    String => TEXT,
    &str => TEXT,
    Vec<u8> => BYTEA,
    &[u8] => BYTEA,
    Vec<&str> => TEXT_ARRAY,
    &[&str] => TEXT_ARRAY,
    Vec<&[u8]> => BYTEA_ARRAY,
    Vec<i64> => INT8_ARRAY,
    std::time::SystemTime => TIMESTAMPTZ,
}

impl<T: PgType> PgType for Option<T> {
    const TYPE: Type = T::TYPE;
}

impl<T: PgType + ToSql + Sync> Param for T {
    fn pg_type(&self) -> Type {
        T::TYPE
    }
}

/// A pooled connection and how it sends statements.
pub(super) struct Db<'a> {
    client: &'a Object,
    named: bool,
}

impl<'a> Db<'a> {
    pub(super) fn new(client: &'a Object, named: bool) -> Self {
        Db { client, named }
    }

    /// Every row `sql` returns.
    pub(super) async fn query(&self, sql: &str, params: &[&dyn Param]) -> Result<Vec<Row>, Error> {
        if self.named {
            let stmt = self.client.prepare_cached(sql).await?;
            return self.client.query(&stmt, &untyped(params)).await;
        }
        self.client.query_typed(sql, &typed(params)).await
    }

    /// The one row `sql` returns, if any (more than one is an error).
    pub(super) async fn query_opt(
        &self,
        sql: &str,
        params: &[&dyn Param],
    ) -> Result<Option<Row>, Error> {
        if self.named {
            let stmt = self.client.prepare_cached(sql).await?;
            return self.client.query_opt(&stmt, &untyped(params)).await;
        }
        self.client.query_typed_opt(sql, &typed(params)).await
    }

    /// The one row `sql` returns (none, or more than one, is an error).
    pub(super) async fn query_one(&self, sql: &str, params: &[&dyn Param]) -> Result<Row, Error> {
        if self.named {
            let stmt = self.client.prepare_cached(sql).await?;
            return self.client.query_one(&stmt, &untyped(params)).await;
        }
        self.client.query_typed_one(sql, &typed(params)).await
    }

    /// How many rows `sql` changed.
    pub(super) async fn execute(&self, sql: &str, params: &[&dyn Param]) -> Result<u64, Error> {
        if self.named {
            let stmt = self.client.prepare_cached(sql).await?;
            return self.client.execute(&stmt, &untyped(params)).await;
        }
        self.client.execute_typed(sql, &typed(params)).await
    }
}

/// The parameters with their types, for an unnamed statement.
pub(super) fn typed<'p>(params: &[&'p dyn Param]) -> Vec<(&'p (dyn ToSql + Sync), Type)> {
    params
        .iter()
        .map(|p| (*p as &(dyn ToSql + Sync), p.pg_type()))
        .collect()
}

/// The parameters alone, for a named statement whose prepare found their
/// types.
fn untyped<'p>(params: &[&'p dyn Param]) -> Vec<&'p (dyn ToSql + Sync)> {
    params.iter().map(|p| *p as &(dyn ToSql + Sync)).collect()
}
