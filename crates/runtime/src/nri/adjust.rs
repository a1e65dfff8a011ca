//! The events whose answers change containers: CreateContainer (an
//! adjustment of the new container, updates of others, evictions, then
//! validation), UpdateContainer and StopContainer (updates). Plugins are
//! asked in index order, each shown what the earlier ones changed; answers are
//! merged with ownership tracking (`petrel_nri::adaptation::merge`), so two
//! plugins changing one thing fail the call with both named, and a plugin
//! cannot later update what another one set.

use std::sync::Arc;
use std::time::Instant;

use petrel_nri::adaptation::validate::check_verdict;
use petrel_nri::adaptation::{
    CreateMerger, CreateResult, Eviction, UpdateMerger, UpdateResult, ValidationError,
};
use petrel_nri::api::{self, Event};

use super::hooks::{HookError, Veto};
use super::{Nri, NriHost};

/// What the plugins asked for in an UpdateContainer or StopContainer.
#[derive(Debug, Default)]
pub struct Updates {
    /// The merged updates (and, for UpdateContainer, the target's resources).
    pub result: UpdateResult,
    /// Evictions asked for in UpdateContainer answers.
    pub evictions: Vec<Eviction>,
}

impl<H: NriHost> Nri<H> {
    /// True if CreateContainer must go through NRI: a plugin adjusts or
    /// validates containers, or the default validator runs (it must run with
    /// no plugin connected too: required plugins fail closed).
    pub fn wants_create(&self) -> bool {
        self.validator.is_some()
            || self.registry.any(Event::CreateContainer)
            || self.registry.any(Event::ValidateContainerAdjustment)
    }

    /// CreateContainer: every plugin in index order (those not subscribed
    /// count as present for the required-plugins check), answers merged,
    /// then the default validator and the validator plugins. The caller
    /// applies `adjust` to the spec, then the updates and evictions, and
    /// records the owners with [`Nri::record_owners`] once the container
    /// exists.
    pub async fn create_container(
        &self,
        pod: &api::PodSandbox,
        ctr: api::Container,
    ) -> Result<CreateResult, HookError> {
        let t0 = Instant::now();
        let recorded = self.owners_snapshot();
        let req = api::CreateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(ctr),
        };
        let mut merger = CreateMerger::new(req).with_recorded_owners(&recorded);
        let prepared = t0.elapsed();
        let mut calls = std::time::Duration::ZERO;
        for p in self.registry.all() {
            let who = api::PluginInstance::from(p.conn.registration());
            if !p.conn.subscribed(Event::CreateContainer) {
                merger.note_plugin(&who);
                continue;
            }
            let t_call = Instant::now();
            let r = p.conn.create_container(merger.request()).await;
            calls += t_call.elapsed();
            if let Some(resp) = self
                .settle(&p, Event::CreateContainer, Veto::Allowed, t_call, r)
                .await?
            {
                merger.apply(&who, resp)?;
            }
        }
        let result = merger.finish();
        self.validate(&result).await?;
        tracing::debug!(
            prepare_us = prepared.as_micros() as u64,
            calls_us = calls.as_micros() as u64,
            rest_us = (t0.elapsed() - prepared - calls).as_micros() as u64,
            "nri: CreateContainer hooks"
        );
        Ok(result)
    }

    /// The default validator first, then every validator plugin. A validator
    /// plugin that fails or times out rejects: validation fails closed.
    async fn validate(&self, result: &CreateResult) -> Result<(), HookError> {
        let validators = self.registry.subscribed(Event::ValidateContainerAdjustment);
        if self.validator.is_none() && validators.is_empty() {
            return Ok(());
        }
        let req = result.validation_request();
        if let Some(v) = &self.validator {
            v.validate(&req)?;
        }
        for p in validators {
            let t0 = Instant::now();
            let r = p.conn.validate_container_adjustment(&req).await;
            let timeout = matches!(&r, Err(e) if e.is_timeout());
            self.observe(
                &p,
                Event::ValidateContainerAdjustment,
                t0.elapsed(),
                r.is_err(),
                timeout,
            );
            let verdict = r.map_err(|e| ValidationError::Rejected {
                validator: p.qualified_name(),
                reason: format!("validation failed: {e}"),
            })?;
            check_verdict(&p.qualified_name(), &verdict)?;
        }
        Ok(())
    }

    /// UpdateContainer: each subscribed plugin sees the resources as the
    /// earlier ones left them; a plugin may refuse the update.
    pub async fn update_container(
        &self,
        pod: &api::PodSandbox,
        ctr: &api::Container,
        resources: api::LinuxResources,
    ) -> Result<Updates, HookError> {
        if !self.registry.any(Event::UpdateContainer) {
            return Ok(Updates::default());
        }
        let recorded = self.owners_snapshot();
        let mut req = api::UpdateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(ctr.clone()),
            linux_resources: Some(resources),
        };
        let mut merger = UpdateMerger::for_update(&req).with_recorded_owners(&recorded);
        let mut evictions = Vec::new();
        for p in self.registry.subscribed(Event::UpdateContainer) {
            req.linux_resources = merger.resources().cloned();
            let who = api::PluginInstance::from(p.conn.registration());
            let t0 = Instant::now();
            let r = p.conn.update_container(&req).await;
            if let Some(resp) = self
                .settle(&p, Event::UpdateContainer, Veto::Allowed, t0, r)
                .await?
            {
                merger.apply(&who, resp.update)?;
                evictions.extend(resp.evict.into_iter().map(|eviction| Eviction {
                    plugin: p.qualified_name(),
                    eviction,
                }));
            }
        }
        Ok(Updates {
            result: merger.finish(),
            evictions,
        })
    }

    /// StopContainer (the container has stopped): plugins may update the
    /// remaining containers. Failures are logged, never returned: the stop
    /// has happened.
    pub async fn stop_container(&self, pod: &api::PodSandbox, ctr: &api::Container) -> Updates {
        if !self.registry.any(Event::StopContainer) {
            return Updates::default();
        }
        let recorded = self.owners_snapshot();
        let req = api::StopContainerRequest {
            pod: Some(pod.clone()),
            container: Some(ctr.clone()),
        };
        let mut merger = UpdateMerger::for_stop().with_recorded_owners(&recorded);
        for p in self.registry.subscribed(Event::StopContainer) {
            let who = api::PluginInstance::from(p.conn.registration());
            let t0 = Instant::now();
            let r = p.conn.stop_container(&req).await;
            let answer = self
                .settle(&p, Event::StopContainer, Veto::Never, t0, r)
                .await;
            if let Ok(Some(resp)) = answer {
                if let Err(e) = merger.apply(&who, resp.update) {
                    // The plugin's updates are dropped; earlier plugins' stay.
                    tracing::warn!(plugin = %p.qualified_name(), error = %e, "nri: updates after StopContainer refused");
                }
            }
        }
        Updates {
            result: merger.finish(),
            evictions: Vec::new(),
        }
    }

    /// Checks a plugin's unsolicited UpdateContainers like an answer: against
    /// the owners recorded so far.
    pub fn check_updates(
        &self,
        plugin: &api::PluginInstance,
        req: &api::UpdateContainersRequest,
    ) -> Result<UpdateResult, petrel_nri::adaptation::MergeError> {
        petrel_nri::adaptation::check_plugin_updates(plugin, req, &self.owners_snapshot())
    }

    /// The owners recorded so far (a cheap copy: the record is replaced,
    /// never changed in place, while readers hold it).
    fn owners_snapshot(&self) -> Arc<api::OwningPlugins> {
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Keeps what plugins set, once their changes are applied.
    pub fn record_owners(&self, owners: &api::OwningPlugins) {
        if owners.owners.is_empty() {
            return;
        }
        let mut cur = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        Arc::make_mut(&mut cur).absorb(owners);
    }

    /// Drops what is recorded for a removed container.
    pub fn forget_owners(&self, container_id: &str) {
        let mut cur = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        if cur.owners.contains_key(container_id) {
            Arc::make_mut(&mut cur).forget(container_id);
        }
    }
}
