import streamlit as st

st.title("Memory")
