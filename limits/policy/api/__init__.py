"""REST views of the policy's settings and of a user's quota."""
