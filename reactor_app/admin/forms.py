"""The forms of the Coordination pages: inspect a key, search the live holds, draw a key's
timeline, and the operator actions' confirmations."""

from __future__ import annotations

from typing import Any

from django import forms

from reactor_app.operator import live

#: the longest timeline period offered (one week)
MAX_TIMELINE_MINUTES = 7 * 24 * 60


class InspectForm(forms.Form):
    """ "What is the state of this key?" — any primitive, any key."""

    primitive = forms.ChoiceField(choices=[(p, p) for p in live.PRIMITIVES], initial="lock")
    # keys are exact text: a key with spaces at its ends is another key (so is an owner)
    key = forms.CharField(max_length=512, strip=False)
    limit = forms.IntegerField(
        required=False, min_value=1, help_text="semaphore limit, to show free slots"
    )


#: the Coordination page's orders of live holds besides the default (oldest first)
HOLD_ORDER_LABELS = {
    "-acquired": "newest first",
    "ttl": "least time left",
    "-ttl": "most time left",
}


class HoldSearchForm(forms.Form):
    """Which live holds the Coordination page lists (its own parameter names, so that the
    inspect form's ``primitive``/``key`` on the same page never filter the holds)."""

    q = forms.CharField(
        required=False,
        max_length=512,
        strip=False,
        label="Key starts with",
        help_text="e.g. acct:",
    )
    h_step = forms.CharField(required=False, max_length=255, label="Step")
    h_reactor = forms.CharField(
        required=False, max_length=255, label="Reactor", help_text="path or class name"
    )
    h_primitive = forms.ChoiceField(
        required=False,
        label="Primitive",
        choices=[("", "all"), *[(p, p) for p in live.HOLDING_PRIMITIVES]],
    )
    h_level = forms.ChoiceField(
        required=False, label="Level", choices=[("", "all"), *[(lv, lv) for lv in live.LEVELS]]
    )
    h_order = forms.ChoiceField(
        required=False,
        label="Order",
        choices=[("", "oldest first"), *[(o, label) for o, label in HOLD_ORDER_LABELS.items()]],
        help_text="not when searching by key",
    )
    cursor = forms.CharField(required=False, max_length=2048, widget=forms.HiddenInput)

    def filters(self) -> dict[str, Any]:
        """``live.hold_page`` arguments (empty when the form is invalid)."""
        if not self.is_valid():
            return {}
        data = self.cleaned_data
        return {
            "key_prefix": data["q"] or None,
            "step": data["h_step"] or None,
            "reactor": data["h_reactor"] or None,
            "primitive": data["h_primitive"] or None,
            "level": data["h_level"] or None,
            # a key search lists by key: the order applies to the other listings
            "ordering": (data["h_order"] or None) if not data["q"] else None,
            "cursor": data["cursor"] or None,
        }


class TimelineForm(forms.Form):
    key = forms.CharField(max_length=512, strip=False)
    minutes = forms.IntegerField(
        min_value=1,
        max_value=MAX_TIMELINE_MINUTES,
        required=False,
        help_text="blank: zoom to the key's events",
    )


class ForceReleaseForm(forms.Form):
    primitive = forms.ChoiceField(choices=[(p, p) for p in live.HOLDING_PRIMITIVES])
    key = forms.CharField(max_length=512, strip=False)
    owner = forms.CharField(max_length=255, required=False, strip=False)


class OrderedKeyForm(forms.Form):
    key = forms.CharField(max_length=512, strip=False)
