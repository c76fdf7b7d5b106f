"""Exercises from solutions, checks, and the autograder for instructors."""
