from lmdeploy.serve.managers.session_manager import Session, SessionManager

__all__ = ["Session", "SessionManager"]
