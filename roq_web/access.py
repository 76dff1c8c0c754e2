"""Who is calling the gateway (roq_web/auth.py decides; this module applies it to requests), the
console's session, and the errors every route answers with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from roq_web.auth import CSRF_HEADER, SESSION_COOKIE, UNSAFE_METHODS, Guard, Identity, cross_site, trusted_host

if TYPE_CHECKING:
    from roq_web.app import Gateway


class HttpError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def error_response(status: int, code: str, message: str) -> JSONResponse:
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse({"error": code, "message": message}, status_code=status, headers=headers)


class Login(BaseModel):
    token: str = Field(max_length=512)


# ------------------------------------------------------------------ who is calling

def caller(request: Request) -> Identity:
    """The caller's identity (401 without a valid credential when web.auth is on); an unsafe
    request is also checked against CSRF."""
    guard: Guard = request.app.state.gateway.guard
    who = guard.identify(request.headers.get("authorization"), request.cookies.get(SESSION_COOKIE))
    if who is None:
        raise HttpError(401, "unauthorized", "log in: this gateway needs a token (Authorization: Bearer TOKEN)")
    if not guard.enabled and not trusted_host(request.headers.get("host"), request.app.state.gateway.config.web.hosts):
        raise HttpError(403, "host", "refused: this gateway runs without web.auth and does not know the host name "
                                     "in this request (add it to web.hosts)")
    refuse_cross_site(request)
    if who.via == "session" and request.method in UNSAFE_METHODS and request.headers.get(CSRF_HEADER) != who.csrf:
        raise HttpError(403, "csrf", "refused: missing or wrong X-CSRF-Token (reload the page)")
    return who


def refuse_cross_site(request: Request) -> None:
    if cross_site(request.method, request.headers.get("origin"), request.headers.get("sec-fetch-site"),
                  request.headers.get("host")):
        raise HttpError(403, "csrf", "refused: the request came from a page of another site")


def admin_caller(who: Annotated[Identity, Depends(caller)]) -> Identity:
    if not who.is_admin:
        raise HttpError(403, "forbidden", f"refused: {who.name} has the {who.role} role; creating, scaling, "
                                          "purging, deleting queues, resetting and deleting consumer groups, "
                                          "changing rules and permissions need the admin role")
    return who


def share_of(request: Request, who: Identity) -> str:
    """Whose share of the gateway a request counts against: its token's name with web.auth on (a
    proxy in front may hide the addresses), its peer's address with it off."""
    if who.via != "open":
        return f"token {who.name}"
    return f"address {request.client.host if request.client else 'unknown'}"


Caller = Annotated[Identity, Depends(caller)]
AdminCaller = Annotated[Identity, Depends(admin_caller)]


def install_session_routes(app: FastAPI, gateway: Gateway) -> None:
    guard = gateway.guard

    @app.get("/api/session", tags=["session"], summary="Who the console is logged in as")
    def session(request: Request) -> dict[str, Any]:
        who = guard.identify(None, request.cookies.get(SESSION_COOKIE))
        if who is None:
            return {"auth": True, "name": None, "role": None, "csrf": None}
        return {"auth": guard.enabled, "name": who.name, "role": who.role, "csrf": who.csrf or "open"}

    @app.post("/api/session", tags=["session"], summary="Log in with a token (sets an HttpOnly cookie)")
    def login(request: Request, body: Login, response: Response) -> dict[str, Any]:
        refuse_cross_site(request)
        if not guard.enabled:
            return {"auth": False, "name": "anonymous", "role": "admin", "csrf": "open"}
        found = guard.check_token(body.token.strip())
        if found is None:
            raise HttpError(401, "unauthorized", "unknown token")
        session_id, who = guard.sessions.open(*found)
        secure = bool(gateway.config.web.tls_cert) or gateway.config.web.secure_cookies
        response.set_cookie(SESSION_COOKIE, session_id, max_age=int(gateway.config.web.session_seconds),
                            httponly=True, samesite="strict", secure=secure, path="/")
        return {"auth": True, "name": who.name, "role": who.role, "csrf": who.csrf}

    @app.delete("/api/session", tags=["session"], summary="Log out")
    def logout(request: Request, response: Response) -> dict[str, Any]:
        session_id = request.cookies.get(SESSION_COOKIE)
        if session_id:
            guard.sessions.close(session_id)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return {"auth": guard.enabled, "name": None, "role": None, "csrf": None}


def check_text(value: str, what: str) -> None:
    """A query value that was not valid UTF-8 arrives with U+FFFD in it: refuse it rather than use
    another name than the caller sent."""
    if "\ufffd" in value:
        raise HttpError(400, "invalid_name", f"{what} must be valid UTF-8 (percent-encoded bytes were not)")
