"""Admin actions over HTTP (the admin role): queues created, scaled, deleted, purged; consumer
groups reset and deleted; autoscaling rules; permissions. Each goes to the leader through `Admin`
with the gateway's own identity."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, Query, Response
from pydantic import BaseModel, Field

from roq.names import check_group_name, check_queue_name
from roq.permissions import MAX_PATTERNS, check_key_name
from roq_web.access import AdminCaller
from roq_web.groups import command_status_code
from roq_web.read_routes import queue_view

if TYPE_CHECKING:
    from roq_web.app import Gateway

# ------------------------------------------------------------------ request bodies

class NewQueue(BaseModel):
    name: str = Field(max_length=64)
    exchanges: int | None = Field(None, ge=1, le=1000)  # None: 1 (with exist_ok: not compared)
    replicas: int | None = Field(None, ge=1, le=2)
    exist_ok: bool = False  # an existing queue with the settings named is success (200, not 201)


class Scale(BaseModel):
    exchanges: int = Field(ge=1, le=1000)


class Rules(BaseModel):
    rules: dict[str, Any] | None = None
    clear: bool = False


Patterns = Annotated[list[str], Field(max_length=MAX_PATTERNS)]


class Rights(BaseModel):
    """Queue patterns (names with * and ?) per right, and admin: what a grant adds or a revoke takes."""
    publish: Patterns = []
    subscribe: Patterns = []
    consume: Patterns = []
    admin: bool = False


class Revocation(Rights):
    all: bool = False  # every right (so does naming none)


# ------------------------------------------------------------------ admin actions

def install_admin_routes(app: FastAPI, gateway: Gateway) -> None:
    admin, sampler = gateway.admin, gateway.sampler

    @app.post("/api/queues", tags=["admin"], status_code=201,
              summary="Create a queue (admin); with exist_ok, one that exists with the settings named is 200",
              responses={200: {"description": "exist_ok: the queue existed with the settings named"}})
    def create_queue(_who: AdminCaller, body: NewQueue, response: Response) -> dict[str, Any]:
        existed = bool(admin.create_queue(body.name, body.exchanges, body.replicas, exist_ok=body.exist_ok)
                       .get("existed"))
        if existed:
            response.status_code = 200
        sampler.sample_now()
        return {**queue_view(gateway, body.name), "existed": existed}

    @app.post("/api/queues/{queue}/scale", tags=["admin"], summary="Change the number of exchanges (admin)")
    def scale_queue(_who: AdminCaller, queue: str, body: Scale) -> dict[str, Any]:
        admin.scale_queue(check_queue_name(queue), body.exchanges)
        sampler.sample_now()
        return queue_view(gateway, queue)

    @app.delete("/api/queues/{queue}", tags=["admin"],
                summary="Delete a queue (admin); if_empty, if_unused: only if it holds no message, has no client")
    def delete_queue(_who: AdminCaller, queue: str, if_empty: bool = False, if_unused: bool = False) -> dict[str, Any]:
        admin.delete_queue(check_queue_name(queue), if_empty=if_empty, if_unused=if_unused)
        sampler.sample_now()
        return {"deleted": queue}

    @app.put("/api/queues/{queue}/rules", tags=["admin"], summary="Set or clear autoscaling rules (admin)")
    def set_rules(_who: AdminCaller, queue: str, body: Rules) -> dict[str, Any]:
        rules = admin.queue_rules(check_queue_name(queue), body.rules, body.clear)
        sampler.sample_now()  # the queue page shows the new rules at once
        return rules


# ------------------------------------------------------------------ purges and consumer groups

Wait = Annotated[float, Query(ge=0, le=60, description="seconds to wait for every running exchange's result")]


def install_command_routes(app: FastAPI, gateway: Gateway) -> None:
    """Admin commands the exchanges apply (roq_web/groups.py): 200 once all running ones did, 202 before."""
    admin = gateway.admin

    def answer(status: dict[str, Any], response: Response) -> dict[str, Any]:
        gateway.sampler.sample_now()  # the figures after the command, at the next read
        response.status_code = command_status_code(status)
        return status

    @app.post("/api/queues/{queue}/purge", tags=["admin"],
              summary="Drop the queue's retained messages and every group's ready and delayed ones (admin)")
    def purge_queue(_who: AdminCaller, queue: str, response: Response, wait: Wait = 10.0) -> dict[str, Any]:
        return answer(admin.purge_queue(check_queue_name(queue), wait=wait), response)

    @app.post("/api/queues/{queue}/groups/{group}/reset", tags=["admin"],
              summary="Drop a group's ready and delayed messages; its members keep what they hold (admin)")
    def reset_group(_who: AdminCaller, queue: str, group: str, response: Response,
                    wait: Wait = 10.0) -> dict[str, Any]:
        return answer(admin.reset_group(check_queue_name(queue), check_group_name(group), wait=wait), response)

    @app.delete("/api/queues/{queue}/groups/{group}", tags=["admin"],
                summary="Delete a group with its messages; refused while it has members (admin)")
    def delete_group(_who: AdminCaller, queue: str, group: str, response: Response,
                     wait: Wait = 10.0) -> dict[str, Any]:
        return answer(admin.delete_group(check_queue_name(queue), check_group_name(group), wait=wait), response)


# ------------------------------------------------------------------ permissions

def install_permission_routes(app: FastAPI, gateway: Gateway) -> None:
    """Who may do what, per queue (docs/security.md "Permissions"): the leader's keys.* operations,
    for admin tokens only, made with the gateway's own key (which must be an admin's)."""
    admin = gateway.admin

    @app.get("/api/permissions", tags=["permissions"], summary="Every key's permissions (admin)")
    def permissions(_who: AdminCaller) -> dict[str, Any]:
        return admin.permissions()

    @app.get("/api/permissions/{key}", tags=["permissions"], summary="One key's permissions (admin)")
    def key_permissions(_who: AdminCaller, key: str) -> dict[str, Any]:
        return admin.key_permissions(check_key_name(key))

    @app.post("/api/permissions/{key}/grant", tags=["permissions"],
              summary="Add queue patterns (or admin) to a key's permissions (admin)")
    def grant(_who: AdminCaller, key: str, body: Rights) -> dict[str, Any]:
        return admin.grant(check_key_name(key), body.publish, body.subscribe, body.consume, body.admin)

    @app.post("/api/permissions/{key}/revoke", tags=["permissions"],
              summary="Take queue patterns (or admin, or everything) from a key's permissions (admin)")
    def revoke(_who: AdminCaller, key: str, body: Revocation) -> dict[str, Any]:
        return admin.revoke(check_key_name(key), body.publish, body.subscribe, body.consume, body.admin, body.all)

    @app.delete("/api/permissions/{key}", tags=["permissions"],
                summary="Remove a key's entry: it gets security.default_permissions again (admin)")
    def reset(_who: AdminCaller, key: str) -> dict[str, Any]:
        return admin.reset_permissions(check_key_name(key))


