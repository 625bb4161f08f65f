from registry.domain.roles import can_operate, role_of


def roles(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"can_operate": False, "role": None}
    return {"can_operate": can_operate(user), "role": role_of(user)}
