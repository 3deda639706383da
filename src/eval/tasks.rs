//! The configured `task`s, each naming a known profile.

use std::collections::{BTreeMap, HashMap};

use super::host::Scope;
use super::plan::Task;
use super::Ctx;
use crate::config::model::ProfileDecl;

pub(super) fn resolve(
    cx: &mut Ctx<'_>,
    sc: &Scope<'_>,
    profiles: &HashMap<&str, &ProfileDecl>,
) -> Vec<Task> {
    let expand = |cx: &mut Ctx<'_>, v| sc.expand(cx, v);
    let path = |cx: &mut Ctx<'_>, v| sc.path(cx, v);
    let mut tasks: BTreeMap<String, Task> = BTreeMap::new();
    for &i in &cx.loaded.order {
        for t in &cx.loaded.files[i].tasks {
            if let Some(p) = &t.profile {
                if p.value != "default" && !profiles.contains_key(p.value.as_str()) {
                    let hint = crate::config::diag::suggest(&p.value, profiles.keys().copied());
                    cx.err(
                        p.loc,
                        format!(
                            "task `{}` names unknown profile `{}`",
                            t.name.value, p.value
                        ),
                        "no such profile",
                        hint.map(|h| format!("did you mean `{h}`?")),
                    );
                }
            }
            let args = if t.run.value.len() == 1 {
                vec!["/bin/sh".into(), "-c".into(), t.run.value[0].clone()]
            } else {
                t.run.value.clone()
            };
            let cwd = t.cwd.as_ref().and_then(|c| path(cx, c));
            let env = t
                .env
                .iter()
                .filter_map(|(k, v)| Some((k.value.clone(), expand(cx, v)?)))
                .collect();
            tasks.insert(
                t.name.value.clone(),
                Task {
                    name: t.name.value.clone(),
                    description: t.description.clone(),
                    args,
                    profile: t.profile.as_ref().map(|p| p.value.clone()),
                    cwd,
                    env,
                },
            );
        }
    }
    tasks.into_values().collect()
}
