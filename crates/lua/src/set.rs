//! Compiling a filters directory into a [`LuaSet`]: every `.lua` file is parsed, run once in
//! a scratch sandboxed VM to read its declaration, validated, and kept as bytecode. This
//! happens off the request path (start, reload); any error names the file and line and
//! rejects the whole set, so the running version stays.

use keymaster_config::{FilterMatch, FilterStage, LuaConfig};
use mlua::{Function, Table, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::dict::SharedDict;
use crate::http_client::{AdminGuard, Client, HttpMetrics, Trust};
use crate::meter::Limits;

/// VM-wide settings from `[lua]` (a worker's VM is rebuilt when they change).
#[derive(Clone)]
pub(crate) struct Settings {
    /// What one call may spend (per call: not part of the VM).
    pub limits: Limits,
    pub memory_limit: usize,
    /// `ctx.http`: timeouts, body cap, pool, trust anchors, the admin guard.
    pub http: Arc<Client>,
    pub dict: Arc<SharedDict>,
}

impl Settings {
    /// `c` with the process's dictionary and HTTP client counters, and the admin
    /// listener's address: `admin_listen` as configured (`[admin] listen`), `admin_bound`
    /// once the listener is bound. Fails when `http_ca_file` is unusable.
    pub(crate) fn from_config(
        c: &LuaConfig,
        admin_listen: Option<SocketAddr>,
        admin_bound: Arc<OnceLock<SocketAddr>>,
        dict: Arc<SharedDict>,
        metrics: Arc<HttpMetrics>,
    ) -> Result<Settings, String> {
        let http = Client {
            timeout: c.http_timeout.get(),
            max_timeout: c.http_max_timeout.get(),
            max_body: usize::try_from(c.http_max_body.0).unwrap_or(usize::MAX),
            idle_timeout: c.http_pool_idle_timeout.get(),
            max_idle: c.http_pool_max_idle,
            admin: AdminGuard {
                allow: c.http_allow_admin,
                configured: admin_listen,
                bound: admin_bound,
            },
            trust: Trust::new(c.http_ca_file.as_deref())?,
            metrics,
        };
        Ok(Settings {
            limits: Limits {
                instructions: c.instruction_budget,
                time: c.max_call_time.get(),
            },
            memory_limit: usize::try_from(c.memory_limit.0).unwrap_or(usize::MAX),
            http: Arc::new(http),
            dict,
        })
    }

    /// Whether a VM built for `self` serves `other` too (the budget is per call).
    pub(crate) fn same_vm(&self, other: &Settings) -> bool {
        self.memory_limit == other.memory_limit
            && self.http.same(&other.http)
            && Arc::ptr_eq(&self.dict, &other.dict)
    }
}

/// One compiled filter file.
pub(crate) struct LuaFile {
    /// The file name without `.lua`: the filter's name.
    pub name: String,
    /// `@path`, so Lua errors read `path:line: message`.
    pub chunk_name: String,
    pub bytecode: Vec<u8>,
    pub stage: FilterStage,
    pub order: i32,
    pub matches: FilterMatch,
    pub has_should: bool,
    /// The source names `http`, so `run` may suspend (runs as a coroutine); otherwise
    /// `run` is a plain call (no coroutine to create and resume).
    pub may_suspend: bool,
    pub needs_request_headers: bool,
    /// The source may read the request headers or remove one (`names_request_header_read`).
    pub reads_request_headers: bool,
    /// The source may read the request's path or query: it names `path` or `query`
    /// anywhere (a conservative test, like `reads_request_headers`).
    pub reads_request_line: bool,
    /// Body opt-in: `request_body = true` / `response_body = true`.
    pub request_body: bool,
    pub response_body: bool,
    /// What `ctx:settings()` returns (`[lua.settings.<name>]`, routes' `lua_settings`).
    pub settings: FileSettings,
}

/// A file's settings from the config, environment references resolved: the table for
/// every route, and the merged table of each route that overrides keys.
#[derive(Default)]
pub(crate) struct FileSettings {
    pub default: toml::Table,
    pub routes: Vec<(String, toml::Table)>,
}

/// Give each file of `set` its settings from `config`. A settings table that names no file
/// of the directory, or an environment variable that is not set, refuses the version.
pub(crate) fn attach_settings(
    set: &mut LuaSet,
    config: &keymaster_config::Config,
) -> Result<(), String> {
    let names: Vec<&str> = set.files.iter().map(|f| f.name.as_str()).collect();
    let unknown = |at: String, name: &str| {
        format!(
            "{at}: no filter {name:?} in the Lua directory; expected one of: {}",
            names.join(", ")
        )
    };
    for name in config.lua.settings.keys() {
        if !names.contains(&name.as_str()) {
            return Err(unknown(format!("lua.settings.{name}"), name));
        }
    }
    for r in &config.routes {
        for name in r.lua_settings.keys() {
            if !names.contains(&name.as_str()) {
                return Err(unknown(
                    format!("routes.{}.lua_settings.{name}", r.name),
                    name,
                ));
            }
        }
    }
    for f in &mut set.files {
        let at = format!("lua.settings.{}", f.name);
        let default = match config.lua.settings.get(&f.name) {
            Some(t) => keymaster_config::env_table(t).map_err(|e| format!("{at}.{e}"))?,
            None => toml::Table::new(),
        };
        let mut routes = Vec::new();
        for r in &config.routes {
            if let Some(over) = r.lua_settings.get(&f.name) {
                let at = format!("routes.{}.lua_settings.{}", r.name, f.name);
                let over = keymaster_config::env_table(over).map_err(|e| format!("{at}.{e}"))?;
                let mut merged = default.clone();
                merged.extend(over);
                routes.push((r.name.clone(), merged));
            }
        }
        f.settings = FileSettings { default, routes };
    }
    Ok(())
}

/// One version of the directory's filters.
pub(crate) struct LuaSet {
    /// Unique per build in this process (worker VMs key their instances by it).
    pub id: u64,
    pub files: Vec<LuaFile>,
    pub settings: Settings,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The `.lua` files of `dir`, sorted by name.
pub(crate) fn lua_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("lua.dir {}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "lua") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// Compile every `.lua` file of `dir`.
pub(crate) fn compile(dir: &Path, settings: Settings) -> Result<LuaSet, String> {
    let lua = crate::vm::new_vm(&settings).map_err(|e| format!("lua VM: {e}"))?;
    let mut files = Vec::new();
    for path in lua_files(dir)? {
        files.push(compile_file(&lua, &path, settings.limits)?);
    }
    Ok(LuaSet {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        files,
        settings,
    })
}

fn compile_file(lua: &mlua::Lua, path: &Path, limits: Limits) -> Result<LuaFile, String> {
    let shown = path.display().to_string();
    let source = std::fs::read(path).map_err(|e| format!("{shown}: {e}"))?;
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("{shown}: the file name must be valid UTF-8"))?
        .to_string();
    let chunk_name = format!("@{shown}");
    let env = crate::vm::new_env(lua).map_err(|e| format!("{shown}: {e}"))?;
    let f: Function = lua
        .load(&source[..])
        .set_name(chunk_name.as_str())
        .set_mode(mlua::chunk::ChunkMode::Text)
        .set_environment(env)
        .into_function()
        .map_err(|e| crate::error_text(&e))?;
    let bytecode = f.dump(false);
    let t = crate::vm::declare(&f, limits).map_err(|e| {
        let text = crate::error_text(&e);
        if text.contains(&shown) {
            text
        } else {
            format!("{shown}: {text}")
        }
    })?;
    let bad = |key: &str, what: &str| format!("{shown}: `{key}` {what}");
    only_keys(&t, DECLARATION_KEYS).map_err(|e| format!("{shown}: {e}"))?;
    let stage = match t
        .get::<Value>("stage")
        .map_err(|e| format!("{shown}: {e}"))?
    {
        Value::String(s) => match s
            .to_str()
            .map(|s| s.to_string())
            .unwrap_or_default()
            .as_str()
        {
            "pre" => FilterStage::Pre,
            "route" => FilterStage::Route,
            "post" => FilterStage::Post,
            "error" => FilterStage::Error,
            _ => {
                return Err(bad(
                    "stage",
                    "must be \"pre\", \"route\", \"post\" or \"error\"",
                ))
            }
        },
        _ => {
            return Err(bad(
                "stage",
                "is missing; expected stage = \"pre\" (or route, post, error)",
            ))
        }
    };
    let order = match t
        .get::<Value>("order")
        .map_err(|e| format!("{shown}: {e}"))?
    {
        Value::Nil => 0,
        Value::Integer(i) => i32::try_from(i).map_err(|_| bad("order", "is out of range"))?,
        Value::Number(n) if n.fract() == 0.0 && n.abs() <= f64::from(i32::MAX) => n as i32,
        _ => return Err(bad("order", "must be an integer")),
    };
    if !matches!(t.get::<Value>("run"), Ok(Value::Function(_))) {
        return Err(bad("run", "must be a function run(ctx)"));
    }
    let has_should = match t.get::<Value>("should_filter") {
        Ok(Value::Nil) => false,
        Ok(Value::Function(_)) => true,
        _ => {
            return Err(bad(
                "should_filter",
                "must be a function should_filter(ctx)",
            ))
        }
    };
    let flag = |key: &str| match t.get::<Value>(key) {
        Ok(Value::Nil) => Ok(false),
        Ok(Value::Boolean(b)) => Ok(b),
        _ => Err(bad(key, "must be true or false")),
    };
    let needs_request_headers = flag("needs_request_headers")?;
    let request_body = flag("request_body")?;
    let response_body = flag("response_body")?;
    if request_body && !matches!(stage, FilterStage::Pre | FilterStage::Route) {
        return Err(bad("request_body", "is for pre and route filters"));
    }
    if response_body && stage != FilterStage::Post {
        return Err(bad("response_body", "is for post filters"));
    }
    let matches = match t.get::<Value>("match") {
        Ok(Value::Nil) => FilterMatch::default(),
        Ok(Value::Table(m)) => read_match(&m).map_err(|e| bad("match", &e))?,
        _ => return Err(bad("match", "must be a table")),
    };
    Ok(LuaFile {
        name,
        chunk_name,
        bytecode,
        stage,
        order,
        matches,
        has_should,
        may_suspend: source.windows(4).any(|w| w == b"http"),
        needs_request_headers,
        reads_request_headers: names_request_header_read(&source),
        reads_request_line: source.windows(4).any(|w| w == b"path")
            || source.windows(5).any(|w| w == b"query"),
        request_body,
        response_body,
        settings: FileSettings::default(),
    })
}

/// Whether `source` names `header` anywhere except right after `_` (`set_header`,
/// `ctx:response_header`, ...), or `remove_header` (which may target the request id): a
/// conservative test for a filter that needs the request headers as the gateway has them.
fn names_request_header_read(source: &[u8]) -> bool {
    source
        .windows(7)
        .any(|w| &w[1..] == b"header" && w[0] != b'_')
        || source.starts_with(b"header")
        || source.windows(13).any(|w| w == b"remove_header")
}

/// What a filter file's declaration table may hold, as TOML tables refuse unknown keys: a
/// typo (`oder = 3`) is an error, not a silent default. Helpers belong in locals.
const DECLARATION_KEYS: &[&str] = &[
    "stage",
    "order",
    "match",
    "should_filter",
    "run",
    "needs_request_headers",
    "request_body",
    "response_body",
];

/// The keys a filter's `match` table may hold.
const MATCH_KEYS: &[&str] = &["routes", "path_prefix", "methods", "headers"];

/// An error naming the first key of `t` not in `known` (in the table's order).
fn only_keys(t: &Table, known: &[&str]) -> Result<(), String> {
    for pair in t.clone().pairs::<Value, Value>() {
        let (key, _) = pair.map_err(|e| e.to_string())?;
        let name = match &key {
            Value::String(s) => s.to_string_lossy(),
            other => format!("{other:?}"),
        };
        if !known.contains(&name.as_str()) {
            return Err(format!(
                "`{name}` is not a declaration key; expected one of {}",
                known.join(", ")
            ));
        }
    }
    Ok(())
}

fn read_match(m: &Table) -> Result<FilterMatch, String> {
    only_keys(m, MATCH_KEYS)?;
    let list = |key: &str| -> Result<Vec<String>, String> {
        match m.get::<Value>(key) {
            Ok(Value::Nil) => Ok(Vec::new()),
            Ok(Value::Table(t)) => t
                .sequence_values::<String>()
                .collect::<mlua::Result<Vec<_>>>()
                .map_err(|_| format!("{key} must be a list of strings")),
            _ => Err(format!("{key} must be a list of strings")),
        }
    };
    let path_prefix = match m.get::<Value>("path_prefix") {
        Ok(Value::Nil) => None,
        Ok(Value::String(s)) => Some(s.to_str().map_err(|e| e.to_string())?.to_string()),
        _ => return Err("path_prefix must be a string".into()),
    };
    let mut methods = list("methods")?;
    for m in &mut methods {
        *m = m.to_ascii_uppercase();
    }
    Ok(FilterMatch {
        routes: list("routes")?,
        path_prefix,
        methods,
        headers: list("headers")?,
    })
}

#[cfg(test)]
mod tests {
    use super::names_request_header_read as reads;

    #[test]
    fn header_reads_are_told_from_writes() {
        assert!(reads(b"local v = ctx:header('x-a')"));
        assert!(reads(b"for k, v in pairs(ctx:headers()) do end"));
        assert!(reads(b"match = { headers = { 'x-a' } }"));
        assert!(reads(b"ctx:remove_header('x-request-id')"));
        assert!(reads(b"header"));
        assert!(!reads(
            b"ctx:set_header('x-in', '1') ctx:add_header('x-b', '2')"
        ));
        assert!(!reads(
            b"ctx:add_response_header('x-out', ctx:response_header('x-o'))"
        ));
    }
}
