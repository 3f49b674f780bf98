"""Who may change live state from the admin: the one operator permission.

Force-release, the ordered-lock skip and reset, and retrying an execution all need it
(superusers have it); reading the Coordination pages needs only the admin view permission.
Cancelling has a permission of its own (``cancel``).
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

#: the permission every state-changing operator action needs
OPERATE_PERMISSION = "reactor_app.force_release"


def can_operate(request: HttpRequest) -> bool:
    user = request.user
    return bool(user.is_active and user.is_staff and user.has_perm(OPERATE_PERMISSION))


def require_operator(request: HttpRequest, doing: str) -> None:
    """``PermissionDenied`` (a 403 page) unless the user may operate; ``doing`` names the action
    in the message ("retrying an execution")."""
    if not can_operate(request):
        raise PermissionDenied(f"{doing} needs the {OPERATE_PERMISSION!r} permission")
