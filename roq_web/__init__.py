"""The web console and HTTP gateway (`roq web`, `roq-web`): docs/http.md."""
