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
//!
//! tokio-postgres logs a named statement's parameters at DEBUG level, each
//! by its `Debug`: a parameter that carries what a call brought or left
//! goes in a [`Redacted`], which logs its size alone.

use std::error::Error as StdError;
use std::fmt;

use bytes::BytesMut;
use deadpool_postgres::Object;
use tokio_postgres::types::{Format, IsNull, ToSql, Type};
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

/// A parameter that carries what a call brought or left (a response, a
/// note, the fingerprint of its arguments, a job's payload or error): bound
/// as its value, and shown by `Debug` as `<redacted N bytes>`, so that no
/// log of the driver's carries it. It holds the value as the statement
/// would (a slice, mostly): nothing is copied.
pub(super) struct Redacted<T>(pub(super) T);

impl<T: Size> fmt::Debug for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<redacted {} bytes>", self.0.size())
    }
}

impl<T: ToSql + Size> ToSql for Redacted<T> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        self.0.to_sql(ty, out)
    }

    fn accepts(ty: &Type) -> bool {
        T::accepts(ty)
    }

    fn to_sql_checked(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        self.0.to_sql_checked(ty, out)
    }

    fn encode_format(&self, ty: &Type) -> Format {
        self.0.encode_format(ty)
    }
}

impl<T: PgType> PgType for Redacted<T> {
    const TYPE: Type = T::TYPE;
}

/// How many bytes a redacted value holds: all its `Debug` shows.
pub(super) trait Size {
    fn size(&self) -> usize;
}

impl Size for &[u8] {
    fn size(&self) -> usize {
        self.len()
    }
}

impl Size for &str {
    fn size(&self) -> usize {
        self.len()
    }
}

impl<T: Size> Size for Option<T> {
    fn size(&self) -> usize {
        self.as_ref().map_or(0, Size::size)
    }
}

impl<T: Size> Size for Vec<T> {
    fn size(&self) -> usize {
        self.iter().map(Size::size).sum()
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
