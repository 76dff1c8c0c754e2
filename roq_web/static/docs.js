/* The HTTP API's reference page (/docs): Swagger UI over /openapi.json.
 *
 * "Try it out" runs in this page, so it is a console request: with a session cookie, a change
 * (POST, PUT, DELETE) must carry the session's X-CSRF-Token, which this script asks /api/session
 * for. Without a session (web.auth on, not logged in), requests go without it and the gateway
 * answers 401, as it would to curl without a token. */
"use strict";

(function () {
  const UNSAFE = new Set(["POST", "PUT", "PATCH", "DELETE"]);
  let csrf = null;

  async function loadSession() {
    try {
      const answer = await fetch("/api/session", { credentials: "same-origin" });
      if (answer.ok) csrf = (await answer.json()).csrf;
    } catch (err) {
      csrf = null; // the reference still renders; changes are refused with the gateway's reason
    }
  }

  function withCsrf(request) {
    if (csrf && UNSAFE.has(String(request.method).toUpperCase())) {
      request.headers["X-CSRF-Token"] = csrf;
    }
    return request;
  }

  window.addEventListener("DOMContentLoaded", () => {
    loadSession();
    window.ui = window.SwaggerUIBundle({
      url: "/openapi.json",
      dom_id: "#swagger-ui",
      deepLinking: true,
      validatorUrl: null, // the validator badge would load an image from another site
      requestInterceptor: withCsrf,
      presets: [window.SwaggerUIBundle.presets.apis],
      layout: "BaseLayout",
    });
  });
})();
