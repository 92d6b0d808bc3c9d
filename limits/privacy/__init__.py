"""A person's data, place by place (each app registers its places): the
export a person may ask for, and erasure everywhere."""
