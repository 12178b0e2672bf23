import streamlit as st

st.title("Roofline")
