"""Objects a run owns: deleted with its RayJob by Kubernetes' garbage collector."""

from __future__ import annotations


def owned_by(job: dict) -> list[dict]:
    """The ownerReferences naming `job` as the API server returned it. The garbage collector
    finds an owner by its uid, not its name (a reference whose uid no longer exists makes the
    dependent an orphan it deletes: Kubernetes docs, "Owners and Dependents"; pkg/controller/
    garbagecollector, attemptToDeleteItem), so a dependent is created after its owner. A
    namespaced owner only owns dependents in its own namespace. blockOwnerDeletion false: a
    foreground deletion of the run need not wait for them."""
    meta = job["metadata"]
    return [{"apiVersion": job["apiVersion"], "kind": job["kind"], "name": meta["name"],
             "uid": meta["uid"], "blockOwnerDeletion": False}]
